-- commit validation, the first half of the fenced-write boundary (C25, C26): at one
-- linearization point, with backend time, this exact lease (identity, lease_id,
-- owner principal, service instance, token) is the current unexpired record, and
-- its token is not below the identity's durable commit high-water mark; then the
-- mark rises to the token and a `pending` idempotency record remembers that this
-- request was validated (so a retry continues it instead of re-judging it, C29).
-- The server then makes the conditional store write (C27) and replaces the
-- pending record by the final result.
-- KEYS: 1 record 2 commit high-water mark 3 idempotency
-- ARGV: 1 identity 2 digest 3 lease_id 4 principal 5 service_instance 6 fencing_token
--       7 idempotency ttl
-- Returns {'validated', now} | {'pending', now, code, {token, validated_at}} |
--         {'replayed', now, code, result} | {'lease_lost', now, problem} | {'idempotency_conflict', now} | ...
local now = now_ms()
local idem, bad = read_idempotency(KEYS[3])
if bad then return {'corrupt', int(now), 'idempotency record'} end
if idem then
  if idem.d ~= ARGV[2] then return {'idempotency_conflict', int(now)} end
  if idem.c == 'pending' then return {'pending', int(now), idem.c, idem.r} end
  return {'replayed', int(now), idem.c, idem.r}
end
local r = load_record(KEYS[1], ARGV[1])
if r == false then return {'corrupt', int(now), 'lease record'} end
local problem = ownership_problem(r, ARGV[3], ARGV[4], ARGV[5], ARGV[6], now)
if problem then return {'lease_lost', int(now), problem} end
local mark = read_counter(KEYS[2])
if mark == false then return {'corrupt', int(now), 'commit high-water mark'} end
local token = tonumber(ARGV[6])
if token < mark then return {'lease_lost', int(now), 'stale_token'} end
if token > mark then redis.call('SET', KEYS[2], ARGV[6]) end
store_idempotency(KEYS[3], ARGV[2], 'pending', {ARGV[6], int(now)}, ARGV[7])
return {'validated', int(now)}
