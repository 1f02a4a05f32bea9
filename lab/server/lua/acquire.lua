-- acquire-if-free (C11): at one linearization point, using backend time, either
-- (no unexpired active record) increment the durable counter, create the lease
-- and store the idempotency result, or change nothing.
-- KEYS: 1 record 2 fence counter 3 history 4 idempotency 5 lease index (new lease_id)
--       6 active index 7 principal quota
-- ARGV: 1 identity 2 digest 3 lease_id 4 principal 5 client_id 6 credential_id 7 service_instance
--       8 ttl_ms 9 maximum_lifetime_ms 10 execution_id 11 job_id 12 trace_id 13 request_id 14 metadata
--       15 idempotency ttl 16 fence max 17 quota (0 = off) 18 history max 19 history retention
--       20 expired-record retention
--       21 the fencing floor (recovery epoch): the next token is above it even if the counter is not
local now = now_ms()
local idem, bad = read_idempotency(KEYS[4])
if bad then return {'corrupt', int(now), 'idempotency record'} end
if idem then
  if idem.d ~= ARGV[2] then return {'idempotency_conflict', int(now)} end
  local lease_id = field_of(idem.r, 'lease_id') or ''
  return {'replayed', int(now), lease_state(KEYS[1], PREFIX .. 'lease:' .. lease_id, lease_id, now), idem.c, idem.r}
end
local r = load_record(KEYS[1], ARGV[1])
if r == false then return {'corrupt', int(now), 'lease record'} end
if r and tonumber(r.expires_at) > now then
  return {'lease_conflict', int(now), int(tonumber(r.expires_at) - now)}
end
local counter = read_counter(KEYS[2])
if counter == false then return {'corrupt', int(now), 'fencing counter'} end
local floor = tonumber(ARGV[21])
if counter < floor then counter = floor end
if counter + 1 > tonumber(ARGV[16]) then return {'fence_exhausted', int(now)} end
local quota = tonumber(ARGV[17])
if quota > 0 then
  local ok, active = pcall(redis.call, 'ZCOUNT', KEYS[7], '(' .. int(now), '+inf')
  if not ok then return {'corrupt', int(now), 'quota index'} end
  if active >= quota then
    local first = redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. int(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return {'quota_exceeded', int(now), int(tonumber(first[2]) - now)}
  end
end
if r then
  -- the predecessor expired: keep its terminal evidence before replacing it
  r.state = 'expired'
  r.ended_at = r.expires_at
  r.end_reason = 'expired'
  push_history(KEYS[3], flatten(r), tonumber(ARGV[18]), ARGV[19])
  redis.call('DEL', KEYS[1])
end
local token = counter + 1
redis.call('SET', KEYS[2], int(token))
local ttl = tonumber(ARGV[8])
local life = tonumber(ARGV[9])
local expires = math.min(now + ttl, now + life)
local now_text = int(now)
-- the record as flatten() lays it out (FIELDS order), built directly
local flat = {
  'record_version', '1', 'lock_key', KEYS[1], 'identity', ARGV[1], 'lease_id', ARGV[3],
  'owner_principal_id', ARGV[4], 'owner_client_id', ARGV[5], 'owner_credential_id', ARGV[6],
  'service_instance_id', ARGV[7], 'fencing_token', int(token), 'acquired_at', now_text, 'renewed_at', now_text,
  'expires_at', int(expires), 'ttl_ms', int(ttl), 'maximum_lifetime_ms', int(life), 'execution_id', ARGV[10],
  'job_id', ARGV[11], 'trace_id', ARGV[12], 'request_id', ARGV[13], 'metadata', ARGV[14], 'state', 'active'}
redis.call('HSET', KEYS[1], unpack(flat))
redis.call('PEXPIREAT', KEYS[1], int(expires + tonumber(ARGV[20])))
redis.call('HSET', KEYS[5], 'k', KEYS[1], 'i', ARGV[1], 's', 'active')
redis.call('PEXPIRE', KEYS[5], ARGV[15])
redis.call('ZADD', KEYS[6], 0, KEYS[1])
if quota > 0 then
  -- members are lock keys, so the index holds at most one entry per identity the principal used
  -- (a release removes its own; an expired one is overwritten by the next acquire of its identity,
  -- and ZCOUNT counts only unexpired ones): no pruning pass needed
  redis.call('ZADD', KEYS[7], int(expires), KEYS[1])
  keep_for(KEYS[7], life)
end
local encoded = cjson.encode(flat)
store_idempotency(KEYS[4], ARGV[2], 'lease_acquired', flat, ARGV[15], encoded)
return {'lease_acquired', now_text, encoded}
