//! The shared state on Redis: one pipelined round trip per sync round.
//!
//! Layout (every key under `state.key_prefix`):
//! - `epoch`: a random value set once (`SET NX`); a replica that sees it change knows the
//!   store lost its data and pushes all its counts again;
//! - `w:<counter>`: a hash of second → count for each rpm/tpm window; a Lua script adds the
//!   deltas, drops seconds older than a minute and returns the live ones, atomically;
//! - `s:<counter>:<period>:<index>`: the micro-USD spent in one budget period (`INCRBY`, with
//!   an expiry past the period's end);
//! - `cooldowns`: a hash of identity → until (unix ms); a Lua script keeps the later of two
//!   untils, drops the past ones and returns the rest.
//!
//! The URL (it may hold a password) is never logged: errors name their kind only.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

use super::admit::{Answer, Ask};
use super::{Pulled, Push, StateBackend, StateError};

/// Add per-second deltas to a window's hash, expire dead seconds, return the live ones.
const WINDOW_SCRIPT: &str = r"
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local s = tonumber(all[i])
  if now - s >= 60 or s - now > 60 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = s
    out[#out + 1] = tonumber(all[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], 120)
return out
";

/// Add to a period's spend (with its expiry) and return the total.
const SPEND_SCRIPT: &str = r"
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return total
";

/// Publish cooldowns (the later until wins), drop past ones, return the live ones.
const COOLDOWN_SCRIPT: &str = r"
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
";

/// Exact admission: check every window and budget against every replica's counts, and only if
/// all have room add the request to the windows and its reservation to the spends. KEYS: the
/// windows, then the spends. ARGV: now, the number of windows, then (limit, add) per window,
/// then (budget, reserve, ttl) per spend. A spend is over when it has reached its budget or
/// the reservation would take it past. Returns `{0}` admitted, `{1, i, wait}` window `i` full
/// for `wait` seconds, `{2, j}` spend `j` over its budget (indices from 1).
const ADMIT_SCRIPT: &str = r"
local now = tonumber(ARGV[1])
local nw = tonumber(ARGV[2])
for i = 1, nw do
  local limit = tonumber(ARGV[1 + 2 * i])
  local add = tonumber(ARGV[2 + 2 * i])
  local all = redis.call('HGETALL', KEYS[i])
  local used = 0
  local live = {}
  for j = 1, #all, 2 do
    local s = tonumber(all[j])
    local c = tonumber(all[j + 1])
    if now - s < 60 and s - now <= 60 and c > 0 then
      used = used + c
      live[#live + 1] = {s, c}
    end
  end
  if used + add > limit then
    if add > limit then
      return {1, i, 60}
    end
    table.sort(live, function(a, b) return a[1] < b[1] end)
    local must = used + add - limit
    local left = 0
    for _, e in ipairs(live) do
      left = left + e[2]
      if left >= must then
        local wait = 60 - (now - e[1])
        if wait < 1 then wait = 1 end
        return {1, i, wait}
      end
    end
    return {1, i, 60}
  end
end
local base = 2 + 2 * nw
for j = nw + 1, #KEYS do
  local at = base + 3 * (j - nw - 1)
  local budget = tonumber(ARGV[at + 1])
  local reserve = tonumber(ARGV[at + 2])
  local spent = tonumber(redis.call('GET', KEYS[j]) or '0')
  if spent >= budget or spent + reserve > budget then
    return {2, j - nw}
  end
end
for i = 1, nw do
  local add = tonumber(ARGV[2 + 2 * i])
  if add > 0 then
    redis.call('HINCRBY', KEYS[i], ARGV[1], add)
    redis.call('EXPIRE', KEYS[i], 120)
  end
end
for j = nw + 1, #KEYS do
  local at = base + 3 * (j - nw - 1)
  local reserve = tonumber(ARGV[at + 2])
  if reserve > 0 then
    redis.call('INCRBY', KEYS[j], reserve)
    local ttl = tonumber(ARGV[at + 3])
    if ttl > 0 then
      redis.call('EXPIRE', KEYS[j], ttl)
    end
  end
end
return {0}
";

/// A Redis server as the replicas' meeting point.
pub struct RedisBackend {
    client: Client,
    prefix: String,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// This replica's candidate epoch, if it is the one to create it.
    epoch: String,
}

impl RedisBackend {
    /// A backend for `url` (not connected yet: the first round connects, and a failed round
    /// reconnects on the next).
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> Result<Self, StateError> {
        let client = Client::open(url)
            .map_err(|e| StateError::Backend(format!("invalid Redis URL ({:?})", e.kind())))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Ok(Self {
            client,
            prefix: prefix.to_string(),
            timeout,
            conn: tokio::sync::Mutex::new(None),
            epoch: format!("{nanos:x}-{}", std::process::id()),
        })
    }

    async fn connection(&self) -> Result<MultiplexedConnection, StateError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(describe)?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn forget_connection(&self) {
        *self.conn.lock().await = None;
    }
}

/// A Redis error in words that never carry the URL.
fn describe(e: redis::RedisError) -> StateError {
    if e.is_timeout() {
        return StateError::Timeout;
    }
    StateError::Backend(format!(
        "{:?}{}",
        e.kind(),
        e.detail().map(|d| format!(": {d}")).unwrap_or_default()
    ))
}

fn malformed(what: &str) -> StateError {
    StateError::Backend(format!("unexpected reply to {what}"))
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok().or(Some(0)),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn pairs(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) if items.len() % 2 == 0 => Some(items),
        _ => None,
    }
}

impl RedisBackend {
    /// One exact admission ([`super::admit`]): one script, one round trip.
    pub async fn admit(&self, ask: &Ask) -> Result<Answer, StateError> {
        let mut conn = self.connection().await?;
        let p = &self.prefix;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ADMIT_SCRIPT)
            .arg(ask.windows.len() + ask.spends.len());
        for (name, _, _) in &ask.windows {
            cmd.arg(format!("{p}{name}"));
        }
        for spend in &ask.spends {
            cmd.arg(format!("{p}{}", spend.name));
        }
        cmd.arg(ask.now_s).arg(ask.windows.len());
        for (_, limit, add) in &ask.windows {
            cmd.arg(*limit).arg(*add);
        }
        for spend in &ask.spends {
            cmd.arg(spend.budget)
                .arg(spend.reserve)
                .arg(spend.ttl.map_or(0, |t| t.as_secs()));
        }
        let reply: Value = match cmd.query_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                self.forget_connection().await;
                return Err(describe(e));
            }
        };
        let Value::Array(items) = reply else {
            return Err(malformed("the admission"));
        };
        let at = |i: usize| items.get(i).and_then(int);
        let index = |i: usize| at(i).and_then(|n| usize::try_from(n).ok()?.checked_sub(1));
        match at(0) {
            Some(0) => Ok(Answer::Admitted),
            Some(1) => Ok(Answer::WindowFull {
                index: index(1).ok_or_else(|| malformed("the admission"))?,
                wait_s: at(2).unwrap_or(60).max(1),
            }),
            Some(2) => Ok(Answer::BudgetSpent {
                index: index(1).ok_or_else(|| malformed("the admission"))?,
            }),
            _ => Err(malformed("the admission")),
        }
    }
}

#[async_trait]
impl StateBackend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn exchange(&self, push: &Push) -> Result<Pulled, StateError> {
        let mut conn = self.connection().await?;
        let p = &self.prefix;
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(format!("{p}epoch"))
            .arg(&self.epoch)
            .arg("NX");
        pipe.cmd("GET").arg(format!("{p}epoch"));
        for (name, deltas) in &push.windows {
            let cmd = pipe
                .cmd("EVAL")
                .arg(WINDOW_SCRIPT)
                .arg(1)
                .arg(format!("{p}{name}"))
                .arg(push.now_s);
            for (s, d) in deltas {
                cmd.arg(*s).arg(*d);
            }
        }
        for (name, ttl, delta) in &push.spends {
            pipe.cmd("EVAL")
                .arg(SPEND_SCRIPT)
                .arg(1)
                .arg(format!("{p}{name}"))
                .arg(*delta)
                .arg(ttl.map_or(0, |t| t.as_secs()));
        }
        let cmd = pipe
            .cmd("EVAL")
            .arg(COOLDOWN_SCRIPT)
            .arg(1)
            .arg(format!("{p}cooldowns"))
            .arg(push.now_ms);
        for (id, until) in &push.cooldowns {
            cmd.arg(id).arg(*until);
        }
        let replies: Vec<Value> = match pipe.query_async(&mut conn).await {
            Ok(r) => r,
            Err(e) => {
                self.forget_connection().await;
                return Err(describe(e));
            }
        };
        let expected = 3 + push.windows.len() + push.spends.len();
        if replies.len() != expected {
            return Err(malformed("the pipeline"));
        }
        let mut it = replies.iter();
        let fresh = matches!(it.next(), Some(Value::Okay));
        let epoch = it
            .next()
            .and_then(text)
            .ok_or_else(|| malformed("GET epoch"))?;
        let mut out = Pulled {
            epoch,
            fresh,
            ..Pulled::default()
        };
        for _ in &push.windows {
            let items = it
                .next()
                .and_then(pairs)
                .ok_or_else(|| malformed("a window"))?;
            let live = items
                .chunks_exact(2)
                .filter_map(|c| Some((int(&c[0])?, int(&c[1])?)))
                .collect();
            out.windows.push(live);
        }
        for _ in &push.spends {
            let total = it
                .next()
                .and_then(int)
                .ok_or_else(|| malformed("a spend"))?;
            out.spends.push(total);
        }
        let items = it
            .next()
            .and_then(pairs)
            .ok_or_else(|| malformed("the cooldowns"))?;
        out.cooldowns = items
            .chunks_exact(2)
            .filter_map(|c| Some((text(&c[0])?, int(&c[1])?)))
            .collect();
        Ok(out)
    }
}
