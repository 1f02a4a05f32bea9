-- recovery sweep (C5, section 8's restore row): after a Valkey restart or restore the
-- server moves to a new token epoch whose floor is above every token issued before;
-- a restored active record below that floor belongs to the old incarnation and is
-- ended here as `revoked` (its holder's renew, release and commit then fail closed).
-- Records at or above the floor, expired records and malformed ones are left alone
-- (an acquire retires expired ones; malformed ones fail closed anyway).
-- KEYS: 1 record 2 history 3 active index
-- ARGV: 1 floor 2 history max 3 history retention 4 idempotency ttl 5 reason
-- (the server runs it only on a connection to the Valkey incarnation it recovers: backend.py)
local now = now_ms()
local r = load_record(KEYS[1], nil)
if r == nil then
  redis.call('ZREM', KEYS[3], KEYS[1])
  return {'absent', int(now)}
end
if r == false then return {'kept', int(now), 'malformed'} end
if tonumber(r.fencing_token) >= tonumber(ARGV[1]) then return {'kept', int(now), 'current'} end
if tonumber(r.expires_at) <= now then return {'kept', int(now), 'expired'} end
r.state = 'revoked'
r.ended_at = int(now)
r.end_reason = 'revoke'
r.ended_by = 'lease-server:recovery'
r.admin_reason = ARGV[5]
local flat = flatten(r)
push_history(KEYS[2], flat, tonumber(ARGV[2]), ARGV[3])
redis.call('DEL', KEYS[1])
local index = PREFIX .. 'lease:' .. r.lease_id
redis.call('HSET', index, 'k', KEYS[1], 'i', r.identity, 's', 'revoked')
keep_for(index, tonumber(ARGV[4]))
redis.call('ZREM', KEYS[3], KEYS[1])
redis.call('ZREM', PREFIX .. 'quota:' .. r.owner_principal_id, KEYS[1])
return {'revoked', int(now), flat}
