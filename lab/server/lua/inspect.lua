-- inspect by identity (C14, read only): the current record (active, or expired by
-- backend time, C10), else the newest terminal evidence, else not found.
-- KEYS: 1 record 2 history
-- ARGV: 1 identity
local now = now_ms()
local r = load_record(KEYS[1], ARGV[1])
if r == false then return {'corrupt', int(now), 'lease record'} end
if r then
  local state = 'expired'
  if tonumber(r.expires_at) > now then state = 'active' end
  return {'found', int(now), state, flatten(r)}
end
local ok, last = pcall(redis.call, 'LINDEX', KEYS[2], 0)
if not ok then return {'corrupt', int(now), 'history'} end
if not last then return {'not_found', int(now)} end
local decoded, flat = pcall(cjson.decode, last)
if not decoded or type(flat) ~= 'table' then return {'corrupt', int(now), 'history'} end
return {'found', int(now), field_of(flat, 'state') or '', flat}
