-- list one slice of the active index (C14, read only but for dropping index
-- entries whose record is gone): keys in lexicographic order strictly after the
-- cursor key, at most `count` of them; only unexpired, well-formed records are
-- returned (the server re-checks key derivation and filters by scope).
-- KEYS: 1 active index
-- ARGV: 1 after (a lock key, or '' for the start) 2 count
local now = now_ms()
local start = '-'
if ARGV[1] ~= '' then start = '(' .. ARGV[1] end
local ok, keys = pcall(redis.call, 'ZRANGEBYLEX', KEYS[1], start, '+', 'LIMIT', 0, tonumber(ARGV[2]))
if not ok then return {'corrupt', int(now), 'active index'} end
local out = {'listed', int(now), keys[#keys] or '', int(#keys)}
for _, key in ipairs(keys) do
  local r = load_record(key, nil)
  if r == nil then
    redis.call('ZREM', KEYS[1], key)
  elseif r and tonumber(r.expires_at) > now then
    out[#out + 1] = flatten(r)
  end
end
return out
