//! Every default value of the config file, written once.
//!
//! A key left out of the file takes the value here. Both layers read this file: the serde
//! defaults in [`schema`](super::schema) (which hold the raw form, so durations are turned
//! back into text such as `30s`) and the `Default` impls of the checked types in
//! [`types`](super::types). Changing a default is a one-line change here, plus its comment in
//! `conf/signalbox.yaml`, which quotes every default.

use std::time::Duration;

use super::vocab::{LogFormat, Strategy, Weights};

// === listen ===

/// `listen.proxy`: where OpenAI-shaped traffic arrives.
pub const PROXY_LISTEN: &str = "0.0.0.0:8080";
/// `listen.admin`: `/metrics`, `/healthz` and `/admin/*`; loopback only by default.
pub const ADMIN_LISTEN: &str = "127.0.0.1:9901";

// === providers ===

/// `providers.<id>.priority` (and so a deployment's priority when neither sets one).
pub const PRIORITY: i32 = 10;
/// `providers.<id>.enabled`.
pub const PROVIDER_ENABLED: bool = true;

// === models ===

/// `models.<name>.capability`: the capability tier.
pub const CAPABILITY: u8 = 1;
/// `models.<name>.enabled`.
pub const MODEL_ENABLED: bool = true;
/// `models.<name>.strategy`.
pub const STRATEGY: Strategy = Strategy::PriorityCheapest;

// === failover ===

/// `failover.max_attempts`.
pub const MAX_ATTEMPTS: u32 = 20;
/// `failover.deadline`.
pub const DEADLINE: Duration = Duration::from_secs(45);
/// `failover.ttfb_timeout` (and every provider's `ttfb_timeout`).
pub const TTFB_TIMEOUT: Duration = Duration::from_secs(30);
/// `failover.connect_timeout` (and every provider's `connect_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// `failover.transient_retries`: off.
pub const TRANSIENT_RETRIES: u32 = 0;
/// `failover.transient_backoff` (and a policy's `retry.backoff`): the base of the jittered,
/// doubling wait before a same-target retry.
pub const TRANSIENT_BACKOFF: Duration = Duration::from_millis(100);
/// `routing_knn` (DESIGN §10): neighbours, warm-up, cost weight, confidence floor, pool bound
/// and the request embedding's deadline.
pub const KNN_K: usize = 5;
pub const KNN_WARMUP: usize = 20;
pub const KNN_ALPHA: f64 = 0.5;
pub const KNN_CONFIDENCE_FLOOR: f64 = 0.1;
pub const KNN_MAX_EXAMPLES_PER_POOL: usize = 10_000;
pub const KNN_EMBED_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a conversation keeps its knn decision (`granularity: conversation`).
pub const KNN_CONVERSATION_TTL: Duration = Duration::from_secs(3600);
/// How long a guardrail check may take (`guardrails.profiles.<name>.timeout`).
pub const GUARDRAIL_TIMEOUT: Duration = Duration::from_secs(2);
/// A policy's `retry.on_status`: the statuses that take its same-target retries (and
/// connection drops).
pub const RETRY_ON_STATUS: [u16; 4] = [502, 503, 504, 529];
/// `failover.first_chunk_hold`: how long a stream's response header may be held waiting for
/// its first content (a time-to-first-token deadline per attempt).
pub const FIRST_CHUNK_HOLD: Duration = Duration::from_secs(15);
/// `failover.stream_idle_timeout`: the longest silence between two chunks of a stream.
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

// === limits ===

/// `limits.max_request_body`: 16MiB.
pub const MAX_REQUEST_BODY: u64 = 16 * 1024 * 1024;
/// `limits.max_request_headers`: 64KiB.
pub const MAX_REQUEST_HEADERS: u64 = 64 * 1024;
/// `limits.header_timeout`: the whole request head, from the connection's accept (or, on a
/// kept-alive connection, from the next request's first byte).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// `limits.body_timeout`: the whole request body, from the end of its head.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// `limits.idle_timeout`: a kept-alive connection's wait for its next request.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

// === health ===

/// `health.failure_threshold` (and every model's `failure_threshold`).
pub const FAILURE_THRESHOLD: u32 = 3;
/// `health.cooldown`.
pub const COOLDOWN: Duration = Duration::from_secs(30);
/// `health.max_ejection`.
pub const MAX_EJECTION: Duration = Duration::from_secs(5 * 60);
/// `health.restore_health`.
pub const RESTORE_HEALTH: f64 = 0.5;
/// `health.health_threshold`: off.
pub const HEALTH_THRESHOLD: f64 = 0.0;
/// `health.respect_retry_after`.
pub const RESPECT_RETRY_AFTER: bool = true;
/// `health.probe_interval`.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(15);
/// `health.bench_after`.
pub const BENCH_AFTER: u32 = 3;
/// `health.bench_window`.
pub const BENCH_WINDOW: Duration = Duration::from_secs(15 * 60);
/// `health.bench_for`.
pub const BENCH_FOR: Duration = Duration::from_secs(10 * 60);
/// `health.success_window`.
pub const SUCCESS_WINDOW: Duration = Duration::from_secs(60);
/// `health.degraded.healthy_ratio`.
pub const HEALTHY_RATIO: f64 = 0.5;
/// `health.degraded.min_providers`.
pub const MIN_PROVIDERS: u32 = 3;
/// `health.degraded.entry_grace`.
pub const ENTRY_GRACE: Duration = Duration::from_secs(60);
/// `health.degraded.exit_grace`.
pub const EXIT_GRACE: Duration = Duration::from_secs(120);

// === routing ===

/// `routing.rank_interval`.
pub const RANK_INTERVAL: Duration = Duration::from_millis(250);
/// `routing.session_ttl`.
pub const SESSION_TTL: Duration = Duration::from_secs(10 * 60);
/// `routing.prefix_bytes`.
pub const PREFIX_BYTES: usize = 1024;
/// `routing.custom_weights`: the `balanced` blend.
pub const CUSTOM_WEIGHTS: Weights = Weights::BALANCED;

// === scoring: the multipliers of the scored strategies (seed 000) ===

/// `scoring.headroom_threshold`: past 80 % of its fuller window a deployment is held back.
pub const HEADROOM_THRESHOLD: f64 = 0.8;
/// `scoring.headroom_floor`: the headroom factor of a full window.
pub const HEADROOM_FLOOR: f64 = 0.1;
/// `scoring.rate_limit_penalty`: a 429 halves the score at once.
pub const RATE_LIMIT_PENALTY: f64 = 0.5;
/// `scoring.rate_limit_decay`: and the penalty is gone a minute later.
pub const RATE_LIMIT_DECAY: Duration = Duration::from_secs(60);

// === ledger and shared state ===

/// `ledger.queue`: rows waiting for the writer (about 25 s of a busy replica at 2.5k rows/s).
pub const LEDGER_QUEUE: usize = 65_536;
/// `ledger.batch`: rows per transaction.
pub const LEDGER_BATCH: usize = 512;
/// `ledger.flush_interval`: how long a batch may wait to fill.
pub const LEDGER_FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// `state.sync_interval`: a cooldown or a count reaches the other replicas within about two.
pub const STATE_SYNC_INTERVAL: Duration = Duration::from_millis(250);
/// `state.key_prefix`.
pub const STATE_KEY_PREFIX: &str = "signalbox:";
/// `state.timeout`: one Redis round trip at most before a replica falls back to local counts
/// (the request path waits this long at most for an exact admission).
pub const STATE_TIMEOUT: Duration = Duration::from_millis(50);

// === log ===

/// `log.format`.
pub const LOG_FORMAT: LogFormat = LogFormat::Text;

/// A default duration in the text form the file uses (`30s`, `5m`, `250ms`), for the serde
/// defaults of the schema, which hold durations as written.
pub fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_duration;

    #[test]
    fn duration_text_reads_back_as_the_same_duration() {
        for d in [
            DEADLINE,
            TTFB_TIMEOUT,
            FIRST_CHUNK_HOLD,
            STREAM_IDLE_TIMEOUT,
            CONNECT_TIMEOUT,
            HEADER_TIMEOUT,
            BODY_TIMEOUT,
            IDLE_TIMEOUT,
            COOLDOWN,
            MAX_EJECTION,
            PROBE_INTERVAL,
            BENCH_WINDOW,
            BENCH_FOR,
            SUCCESS_WINDOW,
            ENTRY_GRACE,
            EXIT_GRACE,
            RANK_INTERVAL,
            SESSION_TTL,
        ] {
            let mut errs = Vec::new();
            assert_eq!(
                parse_duration(&duration_text(d), "x", &mut errs),
                Some(d),
                "{}",
                duration_text(d)
            );
            assert!(errs.is_empty());
        }
        assert_eq!(duration_text(RANK_INTERVAL), "250ms");
        assert_eq!(duration_text(MAX_EJECTION), "5m");
    }
}
