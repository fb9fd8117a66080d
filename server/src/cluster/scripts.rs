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
local function beats(new, cur)
  for i = 1, 4 do
    local r = cmp(new[i], cur[i] or '')
    if r ~= 0 then return r < 0 end
  end
  return false
end
";

/// KEYS: entry, lease. ARGV: t c b a. Stores the result if it beats the stored one (the
/// same total order as `merge.rs`) and returns 1; else returns the stored fields. Either
/// way the key now has a result, so its cluster lease is no longer needed and is deleted.
pub static MERGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{COMPARE}
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a')
redis.call('DEL', KEYS[2])
if (not cur[1]) or beats(ARGV, cur) then
  redis.call('HSET', KEYS[1], 't', ARGV[1], 'c', ARGV[2], 'b', ARGV[3], 'a', ARGV[4])
  return 1
end
return {{cur[1], cur[2] or '', cur[3] or '', cur[4] or ''}}
"
    ))
});

/// KEYS: entry, lease. ARGV: token, ttl ms. A stored result wins over any lease:
/// `{'hit', t, c, b, a}`. Else SET NX PX takes the lease: `{'acquired'}`. Else
/// `{'held', holder token, pttl}`.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local cur = redis.call('HMGET', KEYS[1], 't', 'c', 'b', 'a')
if cur[1] then return {'hit', cur[1], cur[2] or '', cur[3] or '', cur[4] or ''} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'acquired'} end
local holder = redis.call('GET', KEYS[2]) or ''
return {'held', holder, redis.call('PTTL', KEYS[2])}
",
    )
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

/// Loads every script, so the first call on a new connection is one round trip (EVALSHA),
/// not three (EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA).
pub async fn load_all<C: redis::aio::ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    for script in [&*MERGE, &*ACQUIRE, &*RENEW, &*RELEASE] {
        script.load_async(conn).await?;
    }
    Ok(())
}
