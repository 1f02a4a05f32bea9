-- release-if-owner (C13): the same match as renew, then compare-and-delete; the
-- terminal evidence goes to the capped history and the lease index. A stale
-- release (other lease_id or token) never touches a successor.
-- KEYS: 1 record 2 idempotency 3 lease index 4 history 5 active index 6 principal quota
-- ARGV: 1 identity 2 digest 3 lease_id 4 principal 5 service_instance 6 fencing_token
--       7 idempotency ttl 8 history max 9 history retention
local now = now_ms()
local early, r = lease_prologue(now)
if early then return early end
local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], now)
if problem then return {'lease_lost', int(now), problem} end
r.state = 'released'
r.ended_at = int(now)
r.end_reason = 'release'
r.ended_by = ARGV[4]
local flat = flatten(r)
local encoded = push_history(KEYS[4], flat, tonumber(ARGV[8]), ARGV[9])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[3], 's', 'released')
keep_for(KEYS[3], tonumber(ARGV[7]))
redis.call('ZREM', KEYS[5], KEYS[1])
redis.call('ZREM', KEYS[6], KEYS[1])
store_idempotency(KEYS[2], ARGV[2], 'lease_released', flat, ARGV[7], encoded)
return {'lease_released', int(now), encoded}
