//! Shared state: the counters and cooldowns every replica must agree on.
//!
//! The request path never waits on another replica. Each replica keeps deciding from its own
//! lock-free counters ([`Window`], [`Spend`]) and health records; a background sync, every
//! `state.sync_interval`, makes them agree in one round trip to a [`StateBackend`]:
//! - it pushes what this replica counted since the last round (per-second deltas of every
//!   rpm/tpm window, the spend of every budget in its period) and pulls the totals of every
//!   replica, which become each counter's *others* part (a window's count is its own plus the
//!   others', second by second);
//! - it publishes the ejections, credential cooldowns and benchings this replica decided and
//!   adopts everyone else's, so a replica skips a target another one found broken within about
//!   two sync intervals (under a second).
//!
//! Only counters with a limit are shared: a key's `rpm`/`tpm`/`budget`, a user's budget, a
//! deployment's `rpm`/`tpm`/`budget`, a provider's and the global budget. Their names in the
//! store come from the config (key ids, users, provider ids, model names), so every replica
//! with the same config names them alike.
//!
//! Backends: [`redis::RedisBackend`] (`state.redis_url_env`) and [`MemoryBackend`], the same
//! protocol in process, used when no Redis is configured (one replica: the others' part stays
//! zero) and by tests. A backend that does not answer within `state.timeout` is *down*: the
//! replica logs it once, raises `signalbox_state_backend_up 0`, drops the others' part so its
//! own counters take over, and keeps what it could not push; when the backend answers again
//! the unpushed counts go out (a backend that lost its data, seen by a new epoch, is told
//! everything again).
//!
//! Limits are exact by default (`state.limits: exact`, [`admit`]): with Redis, each attempt's
//! admission (its key's and deployment's windows and budgets) is one Lua check-and-add against
//! every replica's counts, bounded by `state.timeout`; what it admits (and reserves) is counted
//! locally as already pushed, so the sync never counts it twice, and a reservation given back
//! locally becomes a negative delta the sync pushes. Past the timeout, or with Redis away, the
//! replica admits on its local counters and the sync reconciles. Under `state.limits: synced`
//! every limit stays check-then-add on local counters: between two syncs, replicas can together
//! overshoot a limit by what they admitted in one interval.

pub mod admit;
pub mod redis;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

use crate::catalog::{Catalog, Deployment};
use crate::config::BudgetPeriod;
use crate::keys::KeyState;
use crate::limits::budget::Spend;
use crate::limits::window::Window;
use crate::metrics::Metrics;
use crate::snapshot::{Runtime, Snapshot};

/// Why a round failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the shared state backend did not answer in time")]
    Timeout,
    #[error("the shared state backend failed: {0}")]
    Backend(String),
}

/// What one round pushes.
#[derive(Debug, Default)]
pub struct Push {
    /// Unix seconds (windows are per second of the wall clock).
    pub now_s: u64,
    /// Unix milliseconds (cooldowns travel as wall-clock instants).
    pub now_ms: u64,
    /// Per window: its store name and this replica's per-second deltas.
    pub windows: Vec<(String, Vec<(u64, i64)>)>,
    /// Per spend: its store name (period included), its lifetime in the store (`None`:
    /// forever) and this replica's delta in micro-USD (negative: reservations given back).
    pub spends: Vec<(String, Option<Duration>, i64)>,
    /// Cooldowns decided here since the last round: identity and until (unix ms).
    pub cooldowns: Vec<(String, u64)>,
}

/// What one round pulls: in the order of the push.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pulled {
    /// The store's identity: a new value means it lost what it held.
    pub epoch: String,
    /// Whether this round created the epoch (the store was empty).
    pub fresh: bool,
    /// Per window: every replica's count per live second.
    pub windows: Vec<Vec<(u64, u64)>>,
    /// Per spend: every replica's total in the period.
    pub spends: Vec<u64>,
    /// Every live cooldown: identity and until (unix ms).
    pub cooldowns: Vec<(String, u64)>,
}

/// Where replicas meet. One call per round: the whole push, the whole answer.
#[async_trait]
pub trait StateBackend: Send + Sync {
    /// `redis` or `memory`.
    fn name(&self) -> &'static str;
    async fn exchange(&self, push: &Push) -> Result<Pulled, StateError>;
}

/// The protocol in process: what a Redis holds, in a map. One replica's backend when no Redis
/// is configured, and the store unit tests share between simulated replicas.
#[derive(Default)]
pub struct MemoryBackend {
    store: tokio::sync::Mutex<MemoryStore>,
}

#[derive(Default)]
struct MemoryStore {
    epoch: bool,
    windows: HashMap<String, HashMap<u64, i64>>,
    spends: HashMap<String, u64>,
    cooldowns: HashMap<String, u64>,
}

#[async_trait]
impl StateBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn exchange(&self, push: &Push) -> Result<Pulled, StateError> {
        let mut store = self.store.lock().await;
        let now = push.now_s;
        let mut out = Pulled {
            epoch: "memory".into(),
            fresh: !std::mem::replace(&mut store.epoch, true),
            ..Pulled::default()
        };
        for (name, deltas) in &push.windows {
            let w = store.windows.entry(name.clone()).or_default();
            for &(s, d) in deltas {
                *w.entry(s).or_default() += d;
            }
            w.retain(|&s, _| now.saturating_sub(s) < 60);
            let mut live: Vec<(u64, u64)> = w
                .iter()
                .map(|(&s, &c)| (s, u64::try_from(c).unwrap_or(0)))
                .collect();
            live.sort_unstable();
            out.windows.push(live);
        }
        for (name, _, delta) in &push.spends {
            let total = store.spends.entry(name.clone()).or_default();
            *total = total.saturating_add_signed(*delta);
            out.spends.push(*total);
        }
        for (id, until) in &push.cooldowns {
            let e = store.cooldowns.entry(id.clone()).or_default();
            *e = (*e).max(*until);
        }
        store.cooldowns.retain(|_, until| *until > push.now_ms);
        out.cooldowns = store
            .cooldowns
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        Ok(out)
    }
}

/// The store's name of a window counter (`k:<id>:rpm`, a deployment's `d:…:tpm`).
pub fn window_key(counter: &str) -> String {
    format!("w:{counter}")
}

/// The store's name of a spend counter in one budget period.
pub fn spend_key(counter: &str, period: BudgetPeriod, index: u64) -> String {
    format!("s:{counter}:{}:{index}", period.as_str())
}

/// A key's counters' names (the same in the sync and in exact admission).
pub fn key_counter(id: &str, what: &str) -> String {
    if what.is_empty() {
        format!("k:{id}")
    } else {
        format!("k:{id}:{what}")
    }
}

/// A user's budget counter's name.
pub fn user_counter(user: &str) -> String {
    format!("u:{user}")
}

/// A deployment's counters' name stem (`:rpm`, `:tpm` follow for its windows; its budget's
/// spend is the stem itself).
pub fn deployment_counter(catalog: &Catalog, d: &Deployment) -> String {
    let model = d.model.map_or("", |m| &*catalog.model(m).name);
    format!(
        "d:{}/{}@{model}",
        catalog.provider(d.provider).id,
        d.upstream_model
    )
}

/// A provider's budget counter's name.
pub fn provider_counter(id: &str) -> String {
    format!("p:{id}")
}

/// The gateway's budget counter's name.
pub const GLOBAL_COUNTER: &str = "g";

/// One shared counter of the serving snapshot.
enum Counter {
    Window(String, Arc<Window>),
    KeyRequests(String, Arc<KeyState>),
    KeyTokens(String, Arc<KeyState>),
    Spend(String, BudgetPeriod, Arc<Spend>),
    KeySpend(String, BudgetPeriod, Arc<KeyState>),
}

impl Counter {
    fn window(&self) -> Option<(&str, &Window)> {
        match self {
            Counter::Window(n, w) => Some((n, w)),
            Counter::KeyRequests(n, k) => Some((n, &k.requests)),
            Counter::KeyTokens(n, k) => Some((n, &k.tokens)),
            _ => None,
        }
    }

    fn spend(&self) -> Option<(&str, BudgetPeriod, &Spend)> {
        match self {
            Counter::Spend(n, p, s) => Some((n, *p, s)),
            Counter::KeySpend(n, p, k) => Some((n, *p, &k.spend)),
            _ => None,
        }
    }
}

/// Every counter of `tables` that has a limit, by its name in the store.
fn counters(tables: &Snapshot) -> Vec<Counter> {
    let mut out = Vec::new();
    if let Some(keys) = &tables.keys {
        for k in keys.iter() {
            let state = k.state.clone();
            if k.rpm.is_some() {
                out.push(Counter::KeyRequests(
                    key_counter(&k.id, "rpm"),
                    state.clone(),
                ));
            }
            if k.tpm.is_some() {
                out.push(Counter::KeyTokens(key_counter(&k.id, "tpm"), state.clone()));
            }
            if let Some(b) = k.budget {
                out.push(Counter::KeySpend(key_counter(&k.id, ""), b.period, state));
            }
        }
        for (user, budget, spend) in keys.user_spends() {
            out.push(Counter::Spend(
                user_counter(user),
                budget.period,
                spend.clone(),
            ));
        }
    }
    let catalog = &tables.catalog;
    for d in &catalog.deployments {
        if d.model.is_none() {
            continue;
        }
        let name = deployment_counter(catalog, d);
        if d.rpm.is_some() {
            out.push(Counter::Window(format!("{name}:rpm"), d.requests.clone()));
        }
        if d.tpm.is_some() {
            out.push(Counter::Window(format!("{name}:tpm"), d.tokens.clone()));
        }
        if let Some(b) = d.budget {
            out.push(Counter::Spend(name, b.period, d.spend.clone()));
        }
    }
    for p in &catalog.providers {
        if let Some(b) = p.budget {
            out.push(Counter::Spend(
                provider_counter(&p.id),
                b.period,
                p.spend.clone(),
            ));
        }
    }
    if let Some(b) = tables.global_budget {
        out.push(Counter::Spend(
            GLOBAL_COUNTER.into(),
            b.period,
            tables.global_spend.clone(),
        ));
    }
    out
}

/// Mark every spend with a budget in `tables` as already in the shared store (what the
/// ledger rebuilt at start: see [`StateSync::sync_once`]'s first contact).
pub fn assume_stored(tables: &Snapshot) {
    for c in counters(tables) {
        if let Some((_, _, s)) = c.spend() {
            s.assume_pushed();
        }
    }
}

/// How long a period's spend is kept in the store: past its end, with a day to spare.
pub fn spend_ttl(period: BudgetPeriod) -> Option<Duration> {
    let day = 86_400;
    match period {
        BudgetPeriod::Day => Some(Duration::from_secs(2 * day)),
        BudgetPeriod::Week => Some(Duration::from_secs(8 * day)),
        BudgetPeriod::Month => Some(Duration::from_secs(32 * day)),
        BudgetPeriod::Total => None,
    }
}

/// A health record that can be cooling: read its until (monotonic ms, 0: not) and adopt a
/// later one.
enum Cooling<'a> {
    Target(&'a crate::health::breaker::TargetHealth),
    Credential(&'a crate::health::breaker::CredentialHealth),
    Deployment(&'a crate::health::breaker::DeploymentHealth),
}

impl Cooling<'_> {
    fn until(&self) -> u64 {
        match self {
            Cooling::Target(t) => t.ejected_until_ms(),
            Cooling::Credential(c) => c.cooling_until_ms(),
            Cooling::Deployment(d) => d.benched_until_ms(),
        }
    }

    fn adopt(&self, until: u64) {
        match self {
            Cooling::Target(t) => t.adopt_ejection(until),
            Cooling::Credential(c) => c.on_exhausted(until),
            Cooling::Deployment(d) => d.adopt_bench(until),
        }
    }
}

/// Every health record that can cool down, by an identity every replica shares.
fn coolings(tables: &Snapshot) -> Vec<(String, Cooling<'_>)> {
    let catalog = &tables.catalog;
    let health = &tables.health;
    let mut out = Vec::new();
    for p in &catalog.providers {
        for (ci, c) in p.credentials.iter().enumerate() {
            if let Some(h) = health.credential(p.idx, ci) {
                out.push((format!("c:{}:{}", p.id, c.id), Cooling::Credential(h)));
            }
        }
    }
    for d in &catalog.deployments {
        let Some(model) = d.model else { continue };
        let provider = catalog.provider(d.provider);
        let name = format!(
            "{}/{}@{}",
            provider.id,
            d.upstream_model,
            catalog.model(model).name
        );
        if let Some(h) = health.deployment(d.idx) {
            out.push((format!("d:{name}"), Cooling::Deployment(h)));
        }
        for (ci, c) in provider.credentials.iter().enumerate() {
            let t = crate::health::TargetRef {
                deployment: Some(d.idx),
                provider: d.provider,
                credential: ci,
            };
            if let Some(h) = health.target(t) {
                out.push((format!("t:{name}:{}", c.id), Cooling::Target(h)));
            }
        }
    }
    out
}

/// The metric families of the shared state.
#[derive(Clone)]
pub struct StateMetrics {
    pub up: IntGauge,
    /// `result` = `ok` | `failed`.
    pub syncs: IntCounterVec,
    /// Exact admissions that fell back to local counters (Redis slow or away).
    pub fallbacks: IntCounter,
}

impl StateMetrics {
    pub fn register(metrics: &Metrics) -> prometheus::Result<Self> {
        let up = IntGauge::new(
            "signalbox_state_backend_up",
            "1 while the shared state backend answers, 0 while this replica counts alone.",
        )?;
        let syncs = IntCounterVec::new(
            Opts::new(
                "signalbox_state_syncs_total",
                "Shared state rounds, by result (ok, failed).",
            ),
            &["result"],
        )?;
        let fallbacks = IntCounter::new(
            "signalbox_state_fallbacks_total",
            "Exact admissions decided on this replica's own counters, Redis not answering within state.timeout.",
        )?;
        // Both results' series from the start, so the family is on /metrics before a round.
        syncs.with_label_values(&["ok"]);
        syncs.with_label_values(&["failed"]);
        metrics.register(Box::new(up.clone()))?;
        metrics.register(Box::new(syncs.clone()))?;
        metrics.register(Box::new(fallbacks.clone()))?;
        Ok(Self {
            up,
            syncs,
            fallbacks,
        })
    }
}

/// Cooldowns within this of each other are the same one; one ending within this is not
/// adopted.
const ADOPT_MARGIN_MS: u64 = 50;

/// The sync: one round every interval against one backend.
pub struct StateSync {
    router: Arc<Runtime>,
    backend: Arc<dyn StateBackend>,
    interval: Duration,
    timeout: Duration,
    metrics: StateMetrics,
    round: tokio::sync::Mutex<Round>,
}

/// What the sync remembers between rounds.
#[derive(Default)]
struct Round {
    /// The store's epoch last seen (`None`: never reached).
    epoch: Option<String>,
    up: Option<bool>,
    /// Per cooldown identity: the until (monotonic ms) last published or adopted, so an
    /// adopted cooldown is not published back as this replica's own.
    known: HashMap<String, u64>,
}

impl StateSync {
    pub fn new(
        router: Arc<Runtime>,
        backend: Arc<dyn StateBackend>,
        interval: Duration,
        timeout: Duration,
        metrics: StateMetrics,
    ) -> Self {
        metrics.up.set(0);
        Self {
            router,
            backend,
            interval,
            timeout,
            metrics,
            round: tokio::sync::Mutex::default(),
        }
    }

    /// One round: push, pull, apply. `Ok` when the backend answered.
    pub async fn sync_once(&self) -> Result<(), StateError> {
        let mut round = self.round.lock().await;
        let tables = self.router.snapshot.load_full();
        let shared = &self.router.health;
        let now_s = shared.wall_s();
        let wall_ms = shared.wall_ms();
        let mono_ms = shared.now_ms();
        let counters = counters(&tables);
        let coolings = coolings(&tables);
        if round.epoch.is_none() {
            // First contact. Spend rebuilt from the ledger at start is marked as already in the
            // store: a store that lived on holds it. A new (empty) store is told everything.
            let hello = Push {
                now_s,
                now_ms: wall_ms,
                ..Push::default()
            };
            let answer = self.call(&mut round, &counters, &hello).await?;
            if answer.fresh {
                for c in &counters {
                    if let Some((_, _, s)) = c.spend() {
                        s.forget_pushed();
                    }
                }
            }
            round.epoch = Some(answer.epoch);
        }

        let mut push = Push {
            now_s,
            now_ms: wall_ms,
            ..Push::default()
        };
        let mut spend_index = Vec::new();
        for c in &counters {
            if let Some((name, w)) = c.window() {
                let mut deltas = Vec::new();
                w.pending(now_s, &mut deltas);
                push.windows.push((window_key(name), deltas));
            }
            if let Some((name, period, s)) = c.spend() {
                let (index, delta) = s.pending(period, now_s);
                spend_index.push(index);
                push.spends
                    .push((spend_key(name, period, index), spend_ttl(period), delta));
            }
        }
        for (id, c) in &coolings {
            let until = c.until();
            if until > mono_ms && round.known.get(id) != Some(&until) {
                push.cooldowns
                    .push((id.clone(), wall_ms + (until - mono_ms)));
                round.known.insert(id.clone(), until);
            }
        }

        let answer = self.call(&mut round, &counters, &push).await?;
        // The pushes landed: in a store that lived on, or in a new one (a new epoch).
        let lost = round.epoch.as_ref().is_some_and(|e| *e != answer.epoch);
        round.epoch = Some(answer.epoch.clone());
        let mut windows = push.windows.iter().zip(&answer.windows);
        let mut spends = push.spends.iter().zip(&answer.spends).zip(&spend_index);
        for c in &counters {
            if let Some((_, w)) = c.window() {
                if let Some(((_, deltas), totals)) = windows.next() {
                    if lost {
                        w.forget_pushed();
                    }
                    w.commit(deltas);
                    w.set_shared(now_s, totals);
                }
            }
            if let Some((_, _, s)) = c.spend() {
                if let Some((((_, _, delta), total), &index)) = spends.next() {
                    if lost {
                        s.forget_pushed();
                    }
                    s.commit(index, *delta);
                    s.set_shared(index, *total);
                }
            }
        }
        let by_id: HashMap<&str, &Cooling<'_>> =
            coolings.iter().map(|(id, c)| (id.as_str(), c)).collect();
        for (id, until_wall) in &answer.cooldowns {
            let Some(c) = by_id.get(id.as_str()) else {
                continue;
            };
            // A cooldown about to end is not adopted: wall and monotonic clocks are read a
            // moment apart, and re-adopting one that just ended (this replica's own, back from
            // the store) would re-open a breaker its probe had just closed.
            if *until_wall <= wall_ms + ADOPT_MARGIN_MS {
                continue;
            }
            let until = mono_ms + (until_wall - wall_ms);
            // Within a few milliseconds of what is known: the same cooldown seen again.
            let known = round.known.get(id).copied().unwrap_or(0);
            if until > known + ADOPT_MARGIN_MS && until > c.until() + ADOPT_MARGIN_MS {
                c.adopt(until);
                round.known.insert(id.clone(), c.until());
            }
        }
        // Remembered a while past its end, so the store's copy (which ends a moment later,
        // clocks apart) is recognised as the same cooldown.
        round.known.retain(|_, until| *until + 1_000 > mono_ms);
        if round.up != Some(true) {
            if round.up == Some(false) {
                tracing::info!(
                    backend = self.backend.name(),
                    "shared state backend reachable again; counters re-synced"
                );
            }
            round.up = Some(true);
        }
        self.metrics.up.set(1);
        self.metrics.syncs.with_label_values(&["ok"]).inc();
        Ok(())
    }

    /// One exchange, bounded by `state.timeout`; a failure or a timeout takes the backend down.
    async fn call(
        &self,
        round: &mut Round,
        counters: &[Counter],
        push: &Push,
    ) -> Result<Pulled, StateError> {
        match tokio::time::timeout(self.timeout, self.backend.exchange(push)).await {
            Ok(Ok(pulled)) => Ok(pulled),
            Ok(Err(e)) => Err(self.down(round, counters, e)),
            Err(_) => Err(self.down(round, counters, StateError::Timeout)),
        }
    }

    /// The backend failed: local counters take over (logged once per outage).
    fn down(&self, round: &mut Round, counters: &[Counter], e: StateError) -> StateError {
        for c in counters {
            if let Some((_, w)) = c.window() {
                w.clear_shared();
            }
            if let Some((_, _, s)) = c.spend() {
                s.clear_shared();
            }
        }
        if round.up != Some(false) {
            tracing::warn!(
                backend = self.backend.name(),
                error = %e,
                "shared state backend unreachable; this replica counts alone until it is back"
            );
            round.up = Some(false);
        }
        // Cooldowns not published this round go out with the next one.
        round.known.clear();
        self.metrics.up.set(0);
        self.metrics.syncs.with_label_values(&["failed"]).inc();
        e
    }
}

/// The background service around a shared [`StateSync`] (the drain on shutdown pushes a
/// last round through the same one).
pub struct StateService(pub Arc<StateSync>);

#[async_trait]
impl BackgroundService for StateService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // The first round at once: spend rebuilt at start meets the store before traffic.
        let _ = self.0.sync_once().await;
        crate::periodic::every(self.0.interval, &mut shutdown, || async {
            let _ = self.0.sync_once().await;
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Outcome;
    use crate::testing::Fixture;

    const CONFIG: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
models:
  m:
    failure_threshold: 1
    deployments: [{ provider: a, model: up-a, rpm: 5, budget: { usd: 10, period: day } }]
"#;

    struct Replica {
        fixture: Fixture,
        router: Arc<Runtime>,
        sync: StateSync,
        metrics: StateMetrics,
    }

    fn replica(backend: Arc<dyn StateBackend>) -> Replica {
        let fixture = Fixture::new(CONFIG);
        let router = Arc::new(fixture.router());
        let metrics = StateMetrics::register(&Metrics::new().expect("metrics")).expect("state");
        let sync = StateSync::new(
            router.clone(),
            backend,
            Duration::from_millis(100),
            Duration::from_secs(1),
            metrics.clone(),
        );
        Replica {
            fixture,
            router,
            sync,
            metrics,
        }
    }

    impl Replica {
        fn requests(&self) -> Arc<Window> {
            self.router.snapshot.load().catalog.deployments[0]
                .requests
                .clone()
        }
        fn spend(&self) -> Arc<Spend> {
            self.router.snapshot.load().catalog.deployments[0]
                .spend
                .clone()
        }
    }

    /// A store that is never there.
    struct Away;

    #[async_trait]
    impl StateBackend for Away {
        fn name(&self) -> &'static str {
            "away"
        }
        async fn exchange(&self, _: &Push) -> Result<Pulled, StateError> {
            Err(StateError::Backend("connection refused".into()))
        }
    }

    #[tokio::test]
    async fn replicas_on_one_store_share_windows_spend_and_ejections() {
        let store: Arc<dyn StateBackend> = Arc::new(MemoryBackend::default());
        let one = replica(store.clone());
        let two = replica(store);
        let wall = one.fixture.shared.wall_s();
        let period = BudgetPeriod::Day;
        one.requests().add(wall, 3);
        one.spend().add(period, wall, 4_000_000);
        two.spend().add(period, wall, 1_000_000);
        for r in [&one, &two, &one] {
            r.sync.sync_once().await.expect("a round");
        }
        assert_eq!(two.requests().used(wall), 3, "one's requests");
        assert_eq!(one.spend().spent(period, wall), 5_000_000);
        assert_eq!(two.spend().spent(period, wall), 5_000_000);
        // Pushed once: more rounds count nothing twice.
        for r in [&one, &two, &one, &two] {
            r.sync.sync_once().await.expect("a round");
        }
        assert_eq!(two.requests().used(wall), 3);
        assert_eq!(two.spend().spent(period, wall), 5_000_000);

        // One ejects the target; two adopts it, on its own clock.
        let t = one.fixture.target("up-a", 0);
        one.fixture.observe(t, Outcome::ServerError);
        let tables_two = two.router.snapshot.load();
        let now_two = two.fixture.shared.now_ms();
        assert!(!matches!(
            tables_two.health.admission(t, now_two),
            crate::health::Admission::No(_)
        ));
        one.sync.sync_once().await.expect("a round");
        two.sync.sync_once().await.expect("a round");
        assert!(matches!(
            tables_two.health.admission(t, now_two),
            crate::health::Admission::No(crate::health::Unavailable::Ejected(_))
        ));
        assert_eq!(one.metrics.up.get(), 1);
        assert_eq!(one.metrics.syncs.with_label_values(&["ok"]).get(), 5);
    }

    #[tokio::test]
    async fn a_store_that_is_away_leaves_each_replica_its_own_counts() {
        let store = Arc::new(MemoryBackend::default());
        let one = replica(store.clone());
        let two = replica(store.clone());
        let wall = one.fixture.shared.wall_s();
        one.requests().add(wall, 2);
        one.sync.sync_once().await.expect("a round");
        two.sync.sync_once().await.expect("a round");
        assert_eq!(two.requests().used(wall), 2);
        // Two loses the store: its own counts only, and it says so.
        let lost = StateSync::new(
            two.router.clone(),
            Arc::new(Away),
            Duration::from_millis(100),
            Duration::from_secs(1),
            two.metrics.clone(),
        );
        two.requests().add(wall, 1);
        assert!(lost.sync_once().await.is_err());
        assert_eq!(two.requests().used(wall), 1);
        assert_eq!(two.metrics.up.get(), 0);
        assert_eq!(two.metrics.syncs.with_label_values(&["failed"]).get(), 1);
        // Back on the store: what it counted meanwhile reaches one.
        two.sync.sync_once().await.expect("a round");
        one.sync.sync_once().await.expect("a round");
        assert_eq!(one.requests().used(wall), 3);
        assert_eq!(two.metrics.up.get(), 1);
    }

    #[tokio::test]
    async fn a_cooldown_that_just_ended_is_not_adopted_back() {
        let store = Arc::new(MemoryBackend::default());
        let one = replica(store.clone());
        let t = one.fixture.target("up-a", 0);
        one.fixture.observe(t, Outcome::ServerError);
        one.sync
            .sync_once()
            .await
            .expect("a round: the ejection is published");
        let tables = one.router.snapshot.load();
        let health = tables.health.target(t).expect("a target record");
        let until = health.ejected_until_ms();
        assert!(until > one.fixture.shared.now_ms());
        // The cooldown ends; the half-open probe succeeds and closes the breaker.
        one.fixture
            .clock
            .advance(Duration::from_millis(until - one.fixture.shared.now_ms()));
        one.fixture.succeed(t, 10);
        assert_eq!(health.ejected_until_ms(), 0, "closed");
        // The store's copy ends a moment after the local one (clocks read apart): it is the
        // same cooldown, over, and must not re-open the breaker.
        for v in store.store.lock().await.cooldowns.values_mut() {
            *v += 20;
        }
        for _ in 0..2 {
            one.sync.sync_once().await.expect("a round");
        }
        assert_eq!(health.ejected_until_ms(), 0, "still closed");
    }
}
