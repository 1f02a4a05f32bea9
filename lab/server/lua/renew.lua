-- renew-if-owner (C12): identity, lease_id, owner principal, service instance and
-- token all match and the lease is unexpired at backend time; the new expiry is
-- min(now + ttl, acquired_at + maximum_lifetime_ms); the token never changes (C7).
-- KEYS: 1 record 2 idempotency 3 lease index 4 principal quota
-- ARGV: 1 identity 2 digest 3 lease_id 4 principal 5 service_instance 6 fencing_token
--       7 ttl_ms ('' keeps the lease's ttl) 8 idempotency ttl 9 expired-record retention 10 quota (0 = off)
local now = now_ms()
local early, r = lease_prologue(now)
if early then return early end
local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], now)
if problem then return {'lease_lost', int(now), problem} end
local ttl = tonumber(r.ttl_ms)
if ARGV[7] ~= '' then ttl = tonumber(ARGV[7]) end
local expires = math.min(now + ttl, tonumber(r.acquired_at) + tonumber(r.maximum_lifetime_ms))
r.renewed_at = int(now)
r.expires_at = int(expires)
r.ttl_ms = int(ttl)
redis.call('HSET', KEYS[1], 'renewed_at', r.renewed_at, 'expires_at', r.expires_at, 'ttl_ms', r.ttl_ms)
redis.call('PEXPIREAT', KEYS[1], int(expires + tonumber(ARGV[9])))
if tonumber(ARGV[10]) > 0 then redis.call('ZADD', KEYS[4], int(expires), KEYS[1]) end
local flat = flatten(r)
local encoded = cjson.encode(flat)
store_idempotency(KEYS[2], ARGV[2], 'lease_renewed', flat, ARGV[8], encoded)
return {'lease_renewed', int(now), encoded}
