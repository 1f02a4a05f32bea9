-- Shared helpers, prepended to every operation script (see lab/server/scripts.py).
-- Numbers never go through tostring(): Lua 5.1 prints "%.14g", which would round
-- a fencing token above 10^14. Every number leaves a script through int().

local PREFIX = 'starintel:target-lease:v1:'
local FIELDS = {'record_version', 'lock_key', 'identity', 'lease_id', 'owner_principal_id', 'owner_client_id',
  'owner_credential_id', 'service_instance_id', 'fencing_token', 'acquired_at', 'renewed_at', 'expires_at',
  'ttl_ms', 'maximum_lifetime_ms', 'execution_id', 'job_id', 'trace_id', 'request_id', 'metadata', 'state'}
local INT_FIELDS = {'fencing_token', 'acquired_at', 'renewed_at', 'expires_at', 'ttl_ms', 'maximum_lifetime_ms'}
local END_FIELDS = {'ended_at', 'end_reason', 'ended_by', 'admin_reason', 'incident_id'}

-- Backend time in Unix milliseconds: the only clock a lease decision uses (C20).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The recovery gate (C5, section 8's restore row) is not in the scripts: the server writes a
-- mutation only on a connection stamped with the run_id of the Valkey incarnation it has
-- recovered the fencing floor for (lab/server/backend.py), the same check `INFO server` made
-- here in every call, once per connection.

-- An integer as exact decimal text.
local function int(n)
  return string.format('%d', n)
end

local function is_int_text(s)
  return type(s) == 'string' and #s <= 16 and string.match(s, '^%d+$') ~= nil
end

-- The record stored at `key`: nil when absent, false when malformed or when its
-- stored identity differs from `identity` (C4: corruption fails closed).
local function load_record(key, identity)
  local ok, flat = pcall(redis.call, 'HGETALL', key)
  if not ok then return false end
  if #flat == 0 then return nil end
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  if r.record_version ~= '1' or r.lock_key ~= key or r.state ~= 'active' then return false end
  if identity ~= nil and r.identity ~= identity then return false end
  for i = 1, #FIELDS do  -- (numeric loops: ipairs costs a function call per element in Lua 5.1)
    if r[FIELDS[i]] == nil then return false end
  end
  for i = 1, #INT_FIELDS do
    if not is_int_text(r[INT_FIELDS[i]]) then return false end
  end
  return r
end

-- A record as a flat field/value array in a fixed order (end fields when present).
local function flatten(r)
  local out, n = {}, 0
  for i = 1, #FIELDS do
    local f = FIELDS[i]
    out[n + 1] = f
    out[n + 2] = r[f]
    n = n + 2
  end
  for i = 1, #END_FIELDS do
    local f = END_FIELDS[i]
    if r[f] ~= nil then
      out[n + 1] = f
      out[n + 2] = r[f]
      n = n + 2
    end
  end
  return out
end

local function field_of(flat, name)
  for i = 1, #flat, 2 do
    if flat[i] == name then return flat[i + 1] end
  end
  return nil
end

-- The durable fencing counter (C5): 0 when absent, false when not a safe integer.
local function read_counter(key)
  local ok, v = pcall(redis.call, 'GET', key)
  if not ok then return false end
  if not v then return 0 end
  if not is_int_text(v) then return false end
  return tonumber(v)
end

-- The idempotency record {d = digest, c = code, r = flat result}: nil, the record, or (nil, 'corrupt').
local function read_idempotency(key)
  local ok, v = pcall(redis.call, 'GET', key)
  if not ok then return nil, 'corrupt' end
  if not v then return nil end
  local decoded, d = pcall(cjson.decode, v)
  if not decoded or type(d) ~= 'table' or type(d.d) ~= 'string' or type(d.c) ~= 'string' or type(d.r) ~= 'table' then
    return nil, 'corrupt'
  end
  return d
end

-- `encoded` (optional) is cjson.encode(flat) when the caller has it already: the record is
-- the same JSON either way ({"d":...,"c":...,"r":[...]}), encoded once per call.
local function store_idempotency(key, digest, code, flat, ttl_ms, encoded)
  encoded = encoded or cjson.encode(flat)
  redis.call('SET', key, '{"d":' .. cjson.encode(digest) .. ',"c":' .. cjson.encode(code) .. ',"r":' .. encoded .. '}',
    'PX', ttl_ms)
end

-- Terminal evidence (C8/C9): newest first, capped, expiring when the identity goes quiet.
-- Returns the entry (the JSON of `flat`), for the idempotency record of the same step.
local function push_history(key, flat, max_entries, retention_ms)
  local encoded = cjson.encode(flat)
  if redis.call('LPUSH', key, encoded) > max_entries then redis.call('LTRIM', key, 0, max_entries - 1) end
  redis.call('PEXPIRE', key, retention_ms)
  return encoded
end

-- Extend a key's TTL to at least `ms` (never shorten it): one call when it extends (GT), the
-- usual case; PTTL only when it did not (no TTL yet, or a longer one).
local function keep_for(key, ms)
  if redis.call('PEXPIRE', key, int(ms), 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, int(ms))
  end
end

-- The current state of lease `lease_id` of the identity whose record is `record_key`.
-- Every ending but expiry writes the lease index, so an index saying 'active' for a
-- lease that is no longer the current unexpired record means it expired.
local function lease_state(record_key, index_key, lease_id, now)
  local ok, cur = pcall(redis.call, 'HMGET', record_key, 'lease_id', 'expires_at')
  if ok and cur[1] == lease_id then
    if tonumber(cur[2]) and tonumber(cur[2]) > now then return 'active' end
    return 'expired'
  end
  local ok2, s = pcall(redis.call, 'HGET', index_key, 's')
  if ok2 and (s == 'released' or s == 'revoked') then return s end
  return 'expired'
end

-- Why the caller does not hold this lease right now (nil when it does): C12/C13.
local function ownership_problem(r, lease_id, principal, instance, token, now)
  if not r then return 'not_found' end
  if r.lease_id ~= lease_id then return 'superseded' end
  if r.owner_principal_id ~= principal or r.service_instance_id ~= instance then return 'not_owner' end
  if r.fencing_token ~= token then return 'token_mismatch' end
  if tonumber(r.expires_at) <= now then return 'expired' end
  return nil
end

-- The prologue renew, release and the admin endings share (their KEYS 1 record, 2 idempotency,
-- 3 lease index; ARGV 1 identity, 2 digest, 3 lease_id): an idempotent replay, and the stored
-- record. Returns (early reply, nil) or (nil, record).
local function lease_prologue(now)
  local idem, bad = read_idempotency(KEYS[2])
  if bad then return {'corrupt', int(now), 'idempotency record'} end
  if idem then
    if idem.d ~= ARGV[2] then return {'idempotency_conflict', int(now)} end
    return {'replayed', int(now), lease_state(KEYS[1], KEYS[3], ARGV[3], now), idem.c, idem.r}
  end
  local r = load_record(KEYS[1], ARGV[1])
  if r == false then return {'corrupt', int(now), 'lease record'} end
  return nil, r
end

-- Admin ending (force-release / revoke, C15): compare against the observed lease
-- (lease_id and token), end it, keep the evidence, and append the audit event to
-- the stream in the same atomic step, before success is reported.
-- KEYS: 1 record 2 idempotency 3 lease index 4 history 5 active index 6 audit stream
-- ARGV: 1 identity 2 digest 3 lease_id 4 admin principal 5 fencing_token 6 reason 7 incident_id
--       8 idempotency ttl 9 history max 10 history retention 11 audit maxlen 12 event_type
--       13 the audit event as a JSON object without the fields added here
local function end_by_admin(new_state, code, end_reason)
  local now = now_ms()
  local early, r = lease_prologue(now)
  if early then return early end
  local problem = nil
  if not r then problem = 'not_found'
  elseif r.lease_id ~= ARGV[3] then problem = 'superseded'
  elseif r.fencing_token ~= ARGV[5] then problem = 'token_mismatch'
  elseif tonumber(r.expires_at) <= now then problem = 'expired' end
  if problem then return {'lease_lost', int(now), problem} end
  r.state = new_state
  r.ended_at = int(now)
  r.end_reason = end_reason
  r.ended_by = ARGV[4]
  r.admin_reason = ARGV[6]
  if ARGV[7] ~= '' then r.incident_id = ARGV[7] end
  local flat = flatten(r)
  local encoded = push_history(KEYS[4], flat, tonumber(ARGV[9]), ARGV[10])
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[3], 's', new_state)
  keep_for(KEYS[3], tonumber(ARGV[8]))
  redis.call('ZREM', KEYS[5], KEYS[1])
  redis.call('ZREM', PREFIX .. 'quota:' .. r.owner_principal_id, KEYS[1])
  -- the audit event: the server's JSON object (ARGV[13]) completed with what only this step knows
  local event = string.sub(ARGV[13], 1, -2) .. string.format(
    ',"backend_time_ms":%s,"lease_id":%s,"fencing_token":%s,"previous_state":"active","resulting_state":"%s",' ..
    '"result_code":"%s","retryable":false,"backend_health":"ok"}',
    int(now), cjson.encode(r.lease_id), r.fencing_token, new_state, code)
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[11], '*', 'event_type', ARGV[12], 'event', event)
  store_idempotency(KEYS[2], ARGV[2], code, flat, ARGV[8], encoded)
  return {code, int(now), encoded}
end
