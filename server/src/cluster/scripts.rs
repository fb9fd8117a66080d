//! The server-side scripts. Each runs atomically on the Redis server and touches only keys
//! of one slot (an entry and its lease), so they work on Redis Cluster too.
//!
//! Comparisons are byte by byte in Lua, never with `<` on strings: Redis sets the collation
//! locale from its environment, and Lua's string `<` uses `strcoll`, which would order
//! configs differently from `merge.rs` under e.g. `en_US.UTF-8`. The time and tuned_at fields
//! are fixed-width sortable hex (see `keys`), so the whole merge rule is a byte comparison.

use std::sync::LazyLock;

use redis::Script;

const COMPARE: &str = r"
local function cmp(a, b)
  if a == b then return 0 end
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      if x < y then return -1 else return 1 end
    end
  end
  if #a < #b then return -1 else return 1 end
end
-- A `t` written before Forget existed has no epoch part: it reads as epoch 0.
local function full_t(t)
  if #t == 16 then return 'ffffffffffffffff' .. t end
  return t
end
local function beats(new, cur)
  local r = cmp(full_t(new[1]), full_t(cur[1] or ''))
  if r ~= 0 then return r < 0 end
  for i = 2, 4 do
    r = cmp(new[i], cur[i] or '')
    if r ~= 0 then return r < 0 end
  end
  return false
end
local function digest(t, c, b, a)
  local h = redis.sha1hex(KEYS[1] .. '\0' .. t .. a .. #c .. ':' .. c .. b)
  return tonumber(string.sub(h, 1, 8), 16), tonumber(string.sub(h, 9, 16), 16)
end
";

/// Reading `u` (`keys::encode_day`): a day as the scripts compare it. Anything else a careless
/// writer left there counts as no day (0); a day is written back in the canonical form.
const DAY: &str = r"
local function day(text)
  local n = tonumber(text or '')
  if not n or n ~= n or n < 0 then return 0 end
  return math.min(math.floor(n), 4294967295)
end
local function day_text(n) return string.format('%.0f', n) end
";

/// A key of another type than the layout says fails the script before it writes anything,
/// naming the key (`refusals::wrong_typed_key`): a script that stopped half way (Redis does
/// not roll back) could store a result and never announce it.
const TYPES: &str = r"
local function wrong(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= kind then return key end
  return nil
end
";

/// KEYS: entry, lease, the shard's stream, the shard's meta. ARGV: t c b a, key text, node
/// id, stream length kept, the result's last use on the node (`keys::encode_day`, 0: none).
///
/// Storing and announcing are one step: if the result beats the stored one (the same total
/// order as `merge.rs`), the script stores it, bumps the shard's sequence number, updates the
/// shard's entry count and digest (see `keys::entry_digest`), appends the winner to the
/// shard's stream, and returns 1. A result equal to the stored one returns 0 and changes
/// nothing: it was announced when it was stored, so a retry after a timeout (whose first try
/// Redis did run) is a no-op, never a stored-but-unannounced result. A worse result returns
/// the stored fields and the stored `u` ('' for none). Either way the key now has a result,
/// so its cluster lease is deleted. A stored result keeps the later of the key's `u` and the
/// day sent: the key's last use, whichever result answers it (uses travel by `TOUCH`).
pub static MERGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{COMPARE}{TYPES}{DAY}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[3], 'stream') or wrong(KEYS[4], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a', 'u')
local used = math.max(day(cur[5]), day(ARGV[8]))
redis.call('DEL', KEYS[2])
if cur[1] then
  local stored_u = cur[5] or ''
  cur = {{cur[1], cur[2] or '', cur[3] or '', cur[4] or ''}}
  if not beats(ARGV, cur) then
    if cur[1] == ARGV[1] and cur[2] == ARGV[2] and cur[3] == ARGV[3] and cur[4] == ARGV[4] then
      return 0
    end
    cur[5] = stored_u
    return cur
  end
end
local x = redis.call('HGET', KEYS[4], 'x') or '0000000000000000'
local hi, lo = tonumber(string.sub(x, 1, 8), 16), tonumber(string.sub(x, 9, 16), 16)
local nhi, nlo = digest(ARGV[1], ARGV[2], ARGV[3], ARGV[4])
hi, lo = bit.bxor(hi, nhi), bit.bxor(lo, nlo)
if cur[1] then
  local ohi, olo = digest(cur[1], cur[2], cur[3], cur[4])
  hi, lo = bit.bxor(hi, ohi), bit.bxor(lo, olo)
else
  redis.call('HINCRBY', KEYS[4], 'n', 1)
end
local seq = redis.call('HINCRBY', KEYS[4], 's', 1)
redis.call('HSET', KEYS[4], 'x', bit.tohex(hi, 8) .. bit.tohex(lo, 8))
redis.call('HSET', KEYS[1], 't', ARGV[1], 'c', ARGV[2], 'b', ARGV[3], 'a', ARGV[4], 's', seq)
if used > 0 then
  redis.call('HSET', KEYS[1], 'u', day_text(used))
else
  redis.call('HDEL', KEYS[1], 'u')
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*', 'k', ARGV[5], 't', ARGV[1],
  'c', ARGV[2], 'b', ARGV[3], 'a', ARGV[4], 'u', day_text(used), 'n', ARGV[6], 's', seq)
return 1
"
    ))
});

/// KEYS: the tombstone hash, the forget stream (one slot: tag `{f}`). ARGV: the scope's text,
/// the stamp (16 hex digits), the tombstone's text, node id, stream length kept.
///
/// Stores a Forget's tombstone unless the hash holds that scope with a stamp at least as
/// high, and announces it on the forget stream in the same step: returns 1, else 0.
pub static FORGET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{COMPARE}{TYPES}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'stream')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and cmp(cur, ARGV[2]) >= 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'f', ARGV[3], 'n', ARGV[4])
return 1
"
    ))
});

/// KEYS: the tombstone hash. ARGV: a scope's text, the stamp read. Deletes the tombstone
/// past its retention, unless a newer one of the scope replaced it since it was read.
pub static FORGET_EXPIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
",
    )
});

/// KEYS: entry, the shard's meta. ARGV: the tombstone's stamp, inverted, as 16 hex digits
/// (the form of the epoch part of `t`).
///
/// Deletes the entry if a tombstone with that stamp drops it (its epoch is lower), taking it
/// out of the shard's count and digest: returns 1, else 0. The caller checked the scope.
pub static FORGET_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{COMPARE}{TYPES}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a')
if not cur[1] then return 0 end
cur = {{cur[1], cur[2] or '', cur[3] or '', cur[4] or ''}}
if cmp(string.sub(full_t(cur[1]), 1, 16), ARGV[1]) <= 0 then return 0 end
redis.call('DEL', KEYS[1])
local x = redis.call('HGET', KEYS[2], 'x') or '0000000000000000'
local hi, lo = tonumber(string.sub(x, 1, 8), 16), tonumber(string.sub(x, 9, 16), 16)
local ohi, olo = digest(cur[1], cur[2], cur[3], cur[4])
hi, lo = bit.bxor(hi, ohi), bit.bxor(lo, olo)
redis.call('HSET', KEYS[2], 'x', bit.tohex(hi, 8) .. bit.tohex(lo, 8))
redis.call('HINCRBY', KEYS[2], 'n', -1)
return 1
"
    ))
});

/// KEYS: entry, the shard's stream, the shard's meta. ARGV: a day (`keys::encode_day`), the
/// key text, node id, stream length kept.
///
/// Carries a use: if the entry exists and its `u` is before the day, sets `u`, bumps the
/// shard's sequence number (the entry's `s` with it, so a node reading the shard again after
/// a gap sees it), and appends the entry, with its new `u`, to the shard's stream, so every
/// follower applies the day (a result it holds already changes nothing else; daemons from
/// before lifecycle read it as a repeat of a result they hold). Returns 1, else 0 (no entry,
/// or a use as late known already: a retry changes nothing). The digest does not cover `u`.
pub static TOUCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}{DAY}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'stream') or wrong(KEYS[3], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a', 'u')
if not cur[1] then return 0 end
if day(cur[5]) >= day(ARGV[1]) then return 0 end
local seq = redis.call('HINCRBY', KEYS[3], 's', 1)
redis.call('HSET', KEYS[1], 'u', ARGV[1], 's', seq)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'k', ARGV[2], 't', cur[1],
  'c', cur[2] or '', 'b', cur[3] or '', 'a', cur[4] or '', 'u', ARGV[1], 'n', ARGV[3], 's', seq)
return 1
"
    ))
});

/// KEYS: entry, the shard's meta. ARGV: the day this node judged the entry by (its effective
/// last use, `store::expiry::entry_day`), today, and the `a` prefix of the first instant
/// after that day (`keys::encode_at`).
///
/// Deletes an entry expired by this node's rule, unless it was used or recorded after the
/// day judged: its `u` (a day after today counting as today, so no careless writer keeps an
/// entry for ever) or its `a` is later (another node touched it, or stored a new result,
/// meanwhile: that was announced, and this node learns it back). Takes it out of the shard's
/// count and digest as `FORGET_ENTRY` does. Returns 1 when deleted, else 0.
pub static EXPIRE_ENTRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{COMPARE}{TYPES}{DAY}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a', 'u')
if not cur[1] then return 0 end
local judged = day(ARGV[1])
if math.min(day(cur[5]), day(ARGV[2])) > judged then return 0 end
cur = {{cur[1], cur[2] or '', cur[3] or '', cur[4] or ''}}
if cmp(string.sub(cur[4], 1, 16), ARGV[3]) >= 0 then return 0 end
redis.call('DEL', KEYS[1])
local x = redis.call('HGET', KEYS[2], 'x') or '0000000000000000'
local hi, lo = tonumber(string.sub(x, 1, 8), 16), tonumber(string.sub(x, 9, 16), 16)
local ohi, olo = digest(cur[1], cur[2], cur[3], cur[4])
hi, lo = bit.bxor(hi, ohi), bit.bxor(lo, olo)
redis.call('HSET', KEYS[2], 'x', bit.tohex(hi, 8) .. bit.tohex(lo, 8))
redis.call('HINCRBY', KEYS[2], 'n', -1)
return 1
"
    ))
});

/// KEYS: the shard's stream, the shard's meta. Where a reader starts, in one step: the last
/// message id (`0-0` for none) and the shard's sequence number, which that message carries.
pub static POSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}
local bad = wrong(KEYS[1], 'stream') or wrong(KEYS[2], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local id = '0-0'
if last[1] then id = last[1][1] end
return {{id, tonumber(redis.call('HGET', KEYS[2], 's') or '0')}}
"
    ))
});

/// KEYS: the shard's meta. Its sequence number, entry count and digest.
pub static META: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local m = redis.call('HMGET', KEYS[1], 's', 'n', 'x')
return {tonumber(m[1] or '0'), tonumber(m[2] or '0'), m[3] or '0000000000000000'}
",
    )
});

/// KEYS: entry, lease. ARGV: token, ttl ms. A stored result wins over any lease:
/// `{'hit', t, c, b, a}`. Else SET NX PX takes the lease: `{'acquired'}`. Else
/// `{'held', holder token, pttl}`.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'string')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a')
if cur[1] then return {{'hit', cur[1], cur[2] or '', cur[3] or '', cur[4] or ''}} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {{'acquired'}} end
local holder = redis.call('GET', KEYS[2]) or ''
return {{'held', holder, redis.call('PTTL', KEYS[2])}}
"
    ))
});

/// KEYS: lease. ARGV: token, ttl ms. Extends the lease only if this token still holds it.
pub static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
",
    )
});

/// KEYS: lease. ARGV: token. Compare-and-delete.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// KEYS: a view's pin hash. ARGV: the hash's lifetime in ms, then for each pin three values:
/// the key text, the proposed pin (a result's encoded fields), and the pin it may replace (''
/// for none).
///
/// The first pin of a key in a view wins, for every node: each proposal is stored only if
/// the key has no pin yet, or its pin is exactly the one named to replace (a pin the
/// proposing node knows a Forget removed). Returns, in order, for each key 0 if its pin is
/// now the one proposed, else the pin it has (a view's first read sends every pin once and
/// gets back only the ones other nodes made first), and keeps the hash alive for its
/// lifetime (a view's idle time).
pub static PIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local out = {}
for i = 2, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    out[#out + 1] = 0
  else
    local cur = redis.call('HGET', KEYS[1], ARGV[i])
    if cur == ARGV[i + 1] then
      out[#out + 1] = 0
    elseif ARGV[i + 2] ~= '' and cur == ARGV[i + 2] then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
      out[#out + 1] = 0
    else
      out[#out + 1] = cur
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return out
",
    )
});

/// KEYS: a shard's checkpoint header, the shard's checkpoint lease, the shard's meta, then
/// the new parts. ARGV: lease token, the new sequence number, its part count, the header
/// JSON, the parts' name stem (`<prefix>cp:{sNN}:`), the shard's sequence number in Redis
/// now, the header's entry count and digest.
///
/// Swaps in a new checkpoint with compare-and-set on the sequence number: only while the
/// caller still holds the lease (-2 otherwise), and only over an older one (-1 when the one
/// there is as new or newer, unless its number is past the shard's own, which no real one
/// is). The count and digest must be Redis's own at that sequence number: the meta's live
/// ones while the shard is still there, and never a number the shard has not reached (-3).
/// In the same step the meta records the checkpoint (`cs`, `cn`, `cx`): what readers compare
/// the header with (`checkpoint::check_record`). The new parts stop expiring; the old ones
/// expire a minute later, so a node reading them now still can. Returns 1 when swapped.
pub static CHECKPOINT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'string') or wrong(KEYS[3], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -2 end
local cur = redis.call('HMGET', KEYS[1], 'seq', 'n')
local cur_seq = tonumber(cur[1] or '') or -1
local new_seq = tonumber(ARGV[2])
if cur_seq >= new_seq and cur_seq <= tonumber(ARGV[6]) then return -1 end
local m = redis.call('HMGET', KEYS[3], 's', 'n', 'x')
local live_seq = tonumber(m[1] or '0') or 0
if live_seq < new_seq then return -3 end
if live_seq == new_seq and ((m[2] or '0') ~= ARGV[7] or (m[3] or '0000000000000000') ~= ARGV[8]) then
  return -3
end
for i = 4, #KEYS do redis.call('PERSIST', KEYS[i]) end
if cur[1] then
  local n = math.min(tonumber(cur[2] or '0') or 0, 64)
  for i = 0, n - 1 do redis.call('PEXPIRE', ARGV[5] .. cur[1] .. ':' .. i, 60000) end
end
redis.call('HSET', KEYS[3], 'cs', ARGV[2], 'cn', ARGV[7], 'cx', ARGV[8])
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'n', ARGV[3], 'h', ARGV[4])
return 1
"
    ))
});

/// KEYS: a shard's checkpoint header, the shard's meta. The header hash's `seq`, `n` and
/// `h`, the meta's live `s`, `n`, `x` and its record of the checkpoint, `cs`, `cn`, `cx`, in
/// one step (nil for a field that is not there), so a swap in between cannot make them
/// disagree.
pub static CHECKPOINT_HEAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}
local bad = wrong(KEYS[1], 'hash') or wrong(KEYS[2], 'hash')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
local h = redis.call('HMGET', KEYS[1], 'seq', 'n', 'h')
local m = redis.call('HMGET', KEYS[2], 's', 'n', 'x', 'cs', 'cn', 'cx')
return {{h[1], h[2], h[3], m[1], m[2], m[3], m[4], m[5], m[6]}}
"
    ))
});

/// KEYS: a shard's checkpoint lease. ARGV: token, ttl ms. `SET NX PX` on a string: 1 when
/// taken, 0 when another builder holds it; a key of another type fails, named.
pub static CHECKPOINT_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TYPES}
local bad = wrong(KEYS[1], 'string')
if bad then return redis.error_reply('WRONGTYPE ' .. bad) end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"
    ))
});

/// How many scripts `load_all` loads.
pub const COUNT: usize = 15;

/// Loads every script, so the first call on a new connection is one round trip (EVALSHA),
/// not three (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA).
pub async fn load_all<C: redis::aio::ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    for script in [
        &*MERGE,
        &*POSITION,
        &*META,
        &*ACQUIRE,
        &*RENEW,
        &*RELEASE,
        &*FORGET,
        &*FORGET_ENTRY,
        &*FORGET_EXPIRE,
        &*TOUCH,
        &*EXPIRE_ENTRY,
        &*PIN,
        &*CHECKPOINT,
        &*CHECKPOINT_HEAD,
        &*CHECKPOINT_LEASE,
    ] {
        script.load_async(conn).await?;
    }
    Ok(())
}
