//! A request's plan: the route's ranked candidates walked one target at a time, against live
//! health.
//!
//! A candidate is a deployment; a target is a deployment with one credential chosen. The
//! ranked order comes from the strategy alone (the scored tables do not reorder by health);
//! health is applied here, as the walk goes, so that what a request sees is always current.
//! The walk has three phases:
//! 1. **lead**: the candidate a per-request decision put first (see [`super::lead`]): a sticky
//!    session, a load-balancing pick among the admissible candidates of the best priority,
//!    the cheapest for this request's tokens, or an exploration pick for learned strategies;
//! 2. **ranked**: the rest in ranked order. A closed breaker is called; a recovering target
//!    (health below full after a restore) is admitted with probability = its health, so it
//!    earns its share back, and is otherwise deferred; a **half-open** target (its cooldown
//!    over, no success since) keeps its ranked place as a probe: the caller must win its
//!    single probe slot, and a request that loses it moves on. Ejected, benched and cooling
//!    targets are skipped without a call, their reason and when they free up kept;
//! 3. **deferred**: recovering candidates that lost their draw, in order.
//!
//! Degraded mode turns exploration off: no load-balancing or exploration picks, no half-open
//! probes, recovering targets admitted without a draw.
//!
//! Credentials are a separate, later choice: round robin across a provider's usable,
//! non-cooling keys; after a credential-scoped failure (401/403/429) the same deployment is
//! tried with its next key before the walk moves on. A target is never tried twice.
//!
//! Deciding stays pure: [`Plan::next`] reads the catalog and health and changes nothing but
//! the plan itself. What the caller must apply — claiming a half-open probe slot, advancing a
//! provider's credential cursor — comes back in the [`Choice`]; the caller confirms with
//! [`Plan::commit`] (or [`Plan::probe_lost`]). The same walk therefore answers `explain`.
//!
//! The plan's *first* is what this request's strategy put first — its lead pick, or else the
//! first eligible candidate in ranked order, healthy or not. `x-llm-fallback` is `true` when
//! another candidate served, whether the first failed or was skipped without a call.

use crate::catalog::surface::Surface;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::lead::{self, splitmix64};
use super::scoring::cost_micro;
use crate::adapters::facts::Needs;
use crate::attempt::{Advance, NoCall};
use crate::catalog::stable_hash;
use crate::catalog::{Catalog, Deployment, DeploymentIdx, ProviderIdx};
use crate::config::{CredentialChoice, ProviderKind, Strategy};
use crate::health::breaker::FULL_HEALTH;
use crate::health::{Admission, HealthRegistry, TargetRef, Unavailable};
use crate::limits::budget::{cost_micro_usd, seconds_to_reset};

/// Why a candidate was passed over without a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// Its provider is switched off.
    ProviderDisabled,
    /// Its provider has no usable credential.
    NoCredential,
    /// Its provider's host has no address yet.
    Unresolved,
    /// Left out by the request's `routing.providers`.
    Excluded,
    /// Its provider is in the caller key's `routing.exclude_providers` (no request undoes it).
    ExcludedByKey,
    /// Its model is outside the caller key's `allowed_models`.
    NotAllowed,
    /// Its provider's API cannot serve the endpoint the caller called (embeddings on an
    /// Anthropic provider, token counting on an OpenAI one).
    Endpoint,
    /// Its model does not declare a capability the request needs.
    NeedsStream,
    NeedsTools,
    NeedsVision,
    NeedsJsonMode,
    /// The prompt is estimated larger than its model's `context_window`.
    ContextWindow,
    /// Its `rpm` window is full (requests in the last minute).
    RpmFull,
    /// Its `tpm` window cannot take this request's estimated tokens.
    TpmFull,
    /// This request's estimated tokens alone exceed its `tpm`: it never can.
    TokensExceedLimit,
    /// Its breaker is open.
    Ejected,
    /// Half-open, with its one probe already in flight.
    ProbeBusy,
    /// Its model is benched.
    Benched,
    /// Its credentials are cooling (401/403/429).
    CredentialCooling,
    /// Its deployment's or its provider's budget would be passed by this request's estimated
    /// cost.
    OverBudget,
}

impl SkipReason {
    pub const ALL: [SkipReason; 20] = [
        SkipReason::ProviderDisabled,
        SkipReason::NoCredential,
        SkipReason::Unresolved,
        SkipReason::Excluded,
        SkipReason::ExcludedByKey,
        SkipReason::NotAllowed,
        SkipReason::Endpoint,
        SkipReason::NeedsStream,
        SkipReason::NeedsTools,
        SkipReason::NeedsVision,
        SkipReason::NeedsJsonMode,
        SkipReason::ContextWindow,
        SkipReason::RpmFull,
        SkipReason::TpmFull,
        SkipReason::TokensExceedLimit,
        SkipReason::Ejected,
        SkipReason::ProbeBusy,
        SkipReason::Benched,
        SkipReason::CredentialCooling,
        SkipReason::OverBudget,
    ];

    /// The stable name: in explain, the `no_provider_available` body and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::ProviderDisabled => "disabled",
            SkipReason::NoCredential => "no_credential",
            SkipReason::Unresolved => "unresolved",
            SkipReason::Excluded => "routing_override",
            SkipReason::ExcludedByKey => "excluded_by_key",
            SkipReason::NotAllowed => "not_allowed",
            SkipReason::Endpoint => "endpoint",
            SkipReason::NeedsStream => "capability:stream",
            SkipReason::NeedsTools => "capability:tools",
            SkipReason::NeedsVision => "capability:vision",
            SkipReason::NeedsJsonMode => "capability:json_mode",
            SkipReason::ContextWindow => "context_window",
            SkipReason::RpmFull => "rpm_full",
            SkipReason::TpmFull => "tpm_full",
            SkipReason::TokensExceedLimit => "tokens_exceed_limit",
            SkipReason::Ejected => "ejected",
            SkipReason::ProbeBusy => "half_open_busy",
            SkipReason::Benched => "benched",
            SkipReason::CredentialCooling => "credential_cooling",
            SkipReason::OverBudget => "over_budget",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

const SKIP_REASONS: usize = SkipReason::ALL.len();
/// How many rate-limit-full skips a plan remembers the model of (a plan rarely holds more
/// candidates than this; further skips are still counted by reason).
const FULL_MODELS: usize = 8;

/// Whether a deployment's `tpm` window can take a request.
enum Tokens {
    /// In this many seconds.
    FreesIn(u64),
    /// Never: the request alone is over the limit.
    Never,
}

/// One attempt's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Position of the deployment in the plan.
    pub position: usize,
    pub credential: usize,
    /// This attempt is the target's half-open probe (the caller holds its slot).
    pub probe: bool,
}

/// What [`Plan::next`] decided, with what the caller must apply before calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub target: Target,
    /// The target in health's terms (for claiming the probe slot).
    pub health_ref: TargetRef,
    /// The provider whose credential cursor to advance, so the next request starts at its
    /// next key.
    pub rotate: ProviderIdx,
}

/// What the plan reads: the catalog, live health and the time.
#[derive(Clone, Copy)]
pub struct PlanEnv<'a> {
    pub catalog: &'a Catalog,
    pub health: &'a HealthRegistry,
    pub now_ms: u64,
    /// Wall-clock seconds (budget periods are calendar periods).
    pub wall_s: u64,
    /// Degraded mode: no exploration (no load-balancing picks, no half-open probes).
    pub degraded: bool,
}

/// Per-request inputs of the lead decision.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts {
    /// The prompt's tokens for an OpenAI-kind provider (counted exactly when near a limit),
    /// and for an Anthropic-kind one (images by each one's formula).
    pub input_tokens: u64,
    pub input_tokens_anthropic: u64,
    pub output_tokens: u64,
    /// Hash of the prompt prefix (`prefix_affinity`).
    pub prefix_hash: Option<u64>,
    /// The deployment a sticky session is bound to (its identity, as the session table
    /// stores it).
    pub session: Option<u64>,
    /// This request's turn of the route's round-robin counter.
    pub round_robin: usize,
    /// Seed of the per-request random draws.
    pub seed: u64,
    /// What the request needs from a model (capabilities declared by the model).
    pub needs: Needs,
    /// The endpoint called: only providers whose API can serve it are candidates.
    pub surface: Surface,
}

impl RequestFacts {
    /// The prompt's tokens for a provider of `kind`.
    pub fn input_for(&self, kind: ProviderKind) -> u64 {
        match kind {
            ProviderKind::OpenAi => self.input_tokens,
            ProviderKind::Anthropic => self.input_tokens_anthropic,
        }
    }
}

#[derive(Debug, Clone)]
enum Candidates {
    Shared(Arc<[DeploymentIdx]>),
    Adhoc(Arc<Deployment>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Lead,
    Ranked,
    Deferred,
    Done,
}

/// Which kind of admission a credential pick accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// At the candidate's ranked place: closed breakers (recovering ones by a draw) and
    /// half-open probes.
    InRank,
    /// A deferred candidate: any closed breaker.
    Deferred,
}

/// Per-request walk over a route's candidates.
#[derive(Debug, Clone)]
pub struct Plan {
    candidates: Candidates,
    strategy: Strategy,
    facts: RequestFacts,
    /// Providers the request allowed (`routing.providers`); `None` = all.
    allowed: Option<Vec<ProviderIdx>>,
    /// Per provider (by index): excluded by the caller key's `routing`; `None` = none.
    excluded: Option<Arc<[bool]>>,
    /// Catalog models the caller's key may be served by (by index); `None` = all.
    models: Option<Arc<[bool]>>,
    /// How many leading candidates a lead pick may choose among (a policy's selected model,
    /// not its fallbacks).
    lead_span: usize,
    /// After a context-length refusal: only models declaring a larger context window.
    min_context: Option<u64>,
    lead: Option<usize>,
    phase: Phase,
    cursor: usize,
    /// Position of the deployment of the last committed target.
    current: Option<usize>,
    tried: Vec<(usize, usize)>,
    deferred: Vec<usize>,
    /// The plan's first: the lead, or the first eligible candidate in ranked order.
    first: Option<usize>,
    /// Whether the plan's first could take a request (a closed breaker) when decided.
    first_healthy: bool,
    skipped: [u16; SKIP_REASONS],
    /// The plan positions of the first candidates skipped for a full `rpm`/`tpm` window
    /// (`signalbox_rate_limit_full_total{model}`); inline, no allocation.
    full_models: [u16; FULL_MODELS],
    full_len: u8,
    /// Every skip as (position, reason), kept only when explaining.
    skips: Option<Vec<(usize, SkipReason)>>,
    soonest_ms: Option<u64>,
    /// When the soonest full `rpm` window frees up.
    rpm_frees_ms: Option<u64>,
    budget_frees_s: Option<u64>,
    rng: u64,
    /// While the first choice is decided: the last candidate [`Self::admissible_now`] judged,
    /// and how it stood (the lead's tier and the first choice ask the same of one candidate).
    admissible_memo: Option<(usize, Option<bool>)>,
}

impl Plan {
    pub fn new(candidates: Arc<[DeploymentIdx]>, strategy: Strategy, facts: RequestFacts) -> Self {
        Self::with(Candidates::Shared(candidates), strategy, facts)
    }

    pub fn adhoc(deployment: Arc<Deployment>, facts: RequestFacts) -> Self {
        Self::with(Candidates::Adhoc(deployment), Strategy::Priority, facts)
    }

    fn with(candidates: Candidates, strategy: Strategy, facts: RequestFacts) -> Self {
        Self {
            candidates,
            strategy,
            facts,
            allowed: None,
            excluded: None,
            models: None,
            lead_span: usize::MAX,
            min_context: None,
            lead: None,
            phase: Phase::Lead,
            cursor: 0,
            current: None,
            tried: Vec::with_capacity(2),
            deferred: Vec::new(),
            first: None,
            first_healthy: false,
            skipped: [0; SKIP_REASONS],
            full_models: [0; FULL_MODELS],
            full_len: 0,
            skips: None,
            soonest_ms: None,
            rpm_frees_ms: None,
            budget_frees_s: None,
            rng: splitmix64(facts.seed | 1),
            admissible_memo: None,
        }
    }

    /// Restrict the plan to these providers (the request's `routing.providers`).
    pub fn restrict_to(&mut self, providers: Vec<ProviderIdx>) {
        self.allowed = Some(providers);
    }

    /// Leave out the providers the caller key excludes (per provider index), whatever the
    /// request's `routing.providers` names.
    pub fn exclude_providers(&mut self, excluded: Arc<[bool]>) {
        self.excluded = Some(excluded);
    }

    /// Whether the request's `routing.providers` and the key's exclusions (if any) leave
    /// `provider` in the plan.
    #[inline]
    pub fn allows_provider(&self, provider: ProviderIdx) -> bool {
        !self.key_excludes(provider)
            && self
                .allowed
                .as_ref()
                .is_none_or(|allowed| allowed.contains(&provider))
    }

    #[inline]
    fn key_excludes(&self, provider: ProviderIdx) -> bool {
        self.excluded
            .as_ref()
            .is_some_and(|e| e.get(provider.get()).copied().unwrap_or(false))
    }

    /// Restrict the plan to the catalog models a caller's key may be served by (by index): a
    /// candidate of another model is skipped (`not_allowed`) wherever the route took it from.
    pub fn restrict_models(&mut self, models: Arc<[bool]>) {
        self.models = Some(models);
    }

    /// From now on, only candidates whose model declares a context window above `tokens` (a
    /// provider refused the prompt as too long for its own).
    pub fn require_context_above(&mut self, tokens: u64) {
        self.min_context = Some(self.min_context.map_or(tokens, |m| m.max(tokens)));
    }

    /// Let a lead pick choose only among the first `n` candidates.
    pub fn with_lead_span(mut self, n: usize) -> Self {
        self.lead_span = n;
        self
    }

    /// Keep every skip with its position (for explain; the request path keeps counts only).
    pub fn explaining(mut self) -> Self {
        self.skips = Some(Vec::new());
        self
    }

    /// Every skip as (position, reason), when explaining.
    pub fn skips(&self) -> &[(usize, SkipReason)] {
        self.skips.as_deref().unwrap_or(&[])
    }

    /// Skip counts by reason, for metrics and the `no_provider_available` body.
    pub fn skip_counts(&self) -> impl Iterator<Item = (SkipReason, u16)> + '_ {
        SkipReason::ALL
            .iter()
            .map(|r| (*r, self.skipped[r.index()]))
            .filter(|(_, n)| *n > 0)
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    pub fn facts(&self) -> &RequestFacts {
        &self.facts
    }

    pub fn len(&self) -> usize {
        match &self.candidates {
            Candidates::Shared(c) => c.len(),
            Candidates::Adhoc(_) => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The deployment at a plan position.
    pub fn deployment<'a>(
        &'a self,
        catalog: &'a Catalog,
        position: usize,
    ) -> Option<&'a Deployment> {
        match &self.candidates {
            Candidates::Shared(c) => c.get(position).map(|d| catalog.deployment(*d)),
            Candidates::Adhoc(d) => (position == 0).then_some(&**d),
        }
    }

    /// The plan's first (what the strategy put first for this request), once decided.
    pub fn first_position(&self) -> Option<usize> {
        self.first
    }

    /// Whether the plan's first had a closed breaker when the plan decided it.
    pub fn first_was_healthy(&self) -> bool {
        self.first_healthy
    }

    /// How many candidates were skipped for a reason.
    pub fn skipped(&self, reason: SkipReason) -> u16 {
        self.skipped[reason as usize]
    }

    /// Why nothing could be called, for a plan that produced no target. The reasons that pass
    /// (an ejection, a full window, a spent budget) decide over the ones that do not: a plan
    /// whose other candidates are ejected or full is told when to come back even when one
    /// candidate has no credential configured.
    pub fn no_call(&self) -> NoCall {
        let n = |r| u32::from(self.skipped(r));
        let rate = n(SkipReason::RpmFull) + n(SkipReason::TpmFull);
        let budget = n(SkipReason::OverBudget);
        let waiting = n(SkipReason::Ejected)
            + n(SkipReason::ProbeBusy)
            + n(SkipReason::Benched)
            + n(SkipReason::CredentialCooling);
        let passing = rate + budget + waiting;
        if passing > 0 {
            if rate == passing {
                NoCall::RateLimited
            } else if budget == passing {
                NoCall::OverBudget
            } else {
                NoCall::Unavailable
            }
        } else if n(SkipReason::TokensExceedLimit) > 0 && n(SkipReason::NotAllowed) == 0 {
            // What could serve can never take this request: waiting cannot help.
            NoCall::TokensExceedLimit
        } else if n(SkipReason::NotAllowed) > 0 {
            // What is left for the key could not serve (or there is nothing left): the key's
            // scope decides, and the answer names nothing it may not see.
            NoCall::NotAllowed
        } else if n(SkipReason::NoCredential) > 0
            && n(SkipReason::ProviderDisabled) == 0
            && n(SkipReason::Unresolved) == 0
        {
            NoCall::NotConfigured
        } else {
            NoCall::Unavailable
        }
    }

    /// Seconds until the soonest spent budget of a skipped candidate resets.
    pub fn budget_frees_s(&self) -> Option<u64> {
        self.budget_frees_s
    }

    /// When the soonest full `rpm` window of a skipped candidate frees up.
    pub fn rpm_frees_ms(&self) -> Option<u64> {
        self.rpm_frees_ms
    }

    /// When the soonest skipped (ejected, benched or cooling) candidate frees up.
    pub fn soonest_ms(&self) -> Option<u64> {
        self.soonest_ms
    }

    /// The next target to call, or `None` when the plan is exhausted. Changes nothing outside
    /// the plan: apply the [`Choice`] (claim a probe slot, advance the credential cursor),
    /// then [`commit`](Self::commit) it, or report a lost probe with
    /// [`probe_lost`](Self::probe_lost) and ask again.
    pub fn next(&mut self, env: &PlanEnv<'_>, advance: Advance) -> Option<Choice> {
        if let (Some(pos), Advance::NextCredential) = (self.current, advance) {
            let pass = if self.phase == Phase::Deferred {
                Pass::Deferred
            } else {
                Pass::InRank
            };
            if let Some(c) = self.pick_credential(env, pos, pass) {
                return Some(c);
            }
        }
        loop {
            match self.phase {
                Phase::Lead => {
                    self.phase = Phase::Ranked;
                    self.decide_first(env);
                    if let Some(pos) = self.lead {
                        if let Some(c) = self.pick_credential(env, pos, Pass::InRank) {
                            return Some(c);
                        }
                    }
                }
                Phase::Ranked => {
                    while self.cursor < self.len() {
                        let pos = self.cursor;
                        self.cursor += 1;
                        if Some(pos) == self.lead {
                            continue;
                        }
                        match self.gate(env, pos) {
                            Err(reason) => self.skip(pos, reason),
                            Ok(()) => {
                                if let Some(c) = self.pick_credential(env, pos, Pass::InRank) {
                                    return Some(c);
                                }
                                if !self.deferred.contains(&pos) {
                                    self.note_unavailable(env, pos);
                                }
                            }
                        }
                    }
                    self.phase = Phase::Deferred;
                    self.cursor = 0;
                }
                Phase::Deferred => {
                    while self.cursor < self.deferred.len() {
                        let pos = self.deferred[self.cursor];
                        self.cursor += 1;
                        if let Some(c) = self.pick_credential(env, pos, Pass::Deferred) {
                            return Some(c);
                        }
                    }
                    self.phase = Phase::Done;
                }
                Phase::Done => return None,
            }
        }
    }

    /// The caller is about to call this choice's target.
    pub fn commit(&mut self, choice: &Choice) {
        self.current = Some(choice.target.position);
        self.tried
            .push((choice.target.position, choice.target.credential));
    }

    /// The caller could not claim the probe slot of this choice's half-open target (another
    /// request holds it): the target is skipped.
    pub fn probe_lost(&mut self, choice: &Choice) {
        self.skip(choice.target.position, SkipReason::ProbeBusy);
    }

    /// The shared store refused this choice's deployment (a full window, a spent budget) that
    /// this replica's counters had not yet seen full: the target is skipped. `frees_s`: when
    /// it can take the request again (the window's wait, the budget period's end).
    pub fn refused_shared(
        &mut self,
        position: usize,
        reason: SkipReason,
        now_ms: u64,
        frees_s: u64,
    ) {
        match reason {
            SkipReason::OverBudget => {
                self.budget_frees_s = Some(self.budget_frees_s.map_or(frees_s, |s| s.min(frees_s)));
            }
            _ => {
                let frees = now_ms.saturating_add(frees_s.saturating_mul(1_000));
                self.rpm_frees_ms = Some(self.rpm_frees_ms.map_or(frees, |s| s.min(frees)));
            }
        }
        self.skip(position, reason);
    }

    /// The plan positions skipped because their deployment's rate-limit window was full, one
    /// entry per skip (the first [`FULL_MODELS`]).
    pub fn full_positions(&self) -> &[u16] {
        &self.full_models[..usize::from(self.full_len)]
    }

    fn skip(&mut self, pos: usize, reason: SkipReason) {
        self.skipped[reason.index()] = self.skipped[reason.index()].saturating_add(1);
        if matches!(reason, SkipReason::RpmFull | SkipReason::TpmFull)
            && usize::from(self.full_len) < FULL_MODELS
        {
            if let Ok(pos) = u16::try_from(pos) {
                self.full_models[usize::from(self.full_len)] = pos;
                self.full_len += 1;
            }
        }
        if let Some(skips) = &mut self.skips {
            skips.push((pos, reason));
        }
    }

    fn note_soonest(&mut self, until: u64) {
        self.soonest_ms = Some(self.soonest_ms.map_or(until, |s| s.min(until)));
    }

    /// Static eligibility: allowed for this request, provider enabled and resolved, a usable
    /// credential, the model able to serve the request (what it declares: a model that
    /// declares no capabilities or no context window is not filtered on them). Health plays
    /// no part.
    fn eligible(&self, env: &PlanEnv<'_>, pos: usize) -> Result<(), SkipReason> {
        let Some(d) = self.deployment(env.catalog, pos) else {
            return Err(SkipReason::Excluded);
        };
        let p = env.catalog.provider(d.provider);
        // Before the request's own narrowing: the key's exclusion is the reason that holds.
        if self.key_excludes(d.provider) {
            return Err(SkipReason::ExcludedByKey);
        }
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(&d.provider) {
                return Err(SkipReason::Excluded);
            }
        }
        if let (Some(models), Some(m)) = (&self.models, d.model) {
            if !models.get(m.get()).copied().unwrap_or(false) {
                return Err(SkipReason::NotAllowed);
            }
        }
        if !p.enabled {
            return Err(SkipReason::ProviderDisabled);
        }
        if self.facts.surface.served_by(p.kind).is_none() {
            return Err(SkipReason::Endpoint);
        }
        if p.addrs.is_empty() {
            return Err(SkipReason::Unresolved);
        }
        if !p.has_usable_credential() {
            return Err(SkipReason::NoCredential);
        }
        if let Some(model) = d.model.map(|m| env.catalog.model(m)) {
            let needs = self.facts.needs;
            if let Some(can) = model.capabilities {
                let missing = [
                    (needs.stream && !can.stream, SkipReason::NeedsStream),
                    (needs.tools && !can.tools, SkipReason::NeedsTools),
                    (needs.vision && !can.vision, SkipReason::NeedsVision),
                    (needs.json_mode && !can.json_mode, SkipReason::NeedsJsonMode),
                ];
                if let Some((_, reason)) = missing.iter().find(|(m, _)| *m) {
                    return Err(*reason);
                }
            }
            let input = self.facts.input_for(p.kind);
            if model.context_window.is_some_and(|w| input > u64::from(w)) {
                return Err(SkipReason::ContextWindow);
            }
            if let Some(floor) = self.min_context {
                if model.context_window.is_none_or(|w| u64::from(w) <= floor) {
                    return Err(SkipReason::ContextWindow);
                }
            }
        }
        Ok(())
    }

    /// Deployment-level checks before any credential: eligible, the model not benched, room
    /// in the deployment's `rpm` window.
    fn gate(&mut self, env: &PlanEnv<'_>, pos: usize) -> Result<(), SkipReason> {
        self.eligible(env, pos)?;
        let Some(d) = self.deployment(env.catalog, pos) else {
            return Err(SkipReason::Excluded);
        };
        if d.model.is_none() {
            return Ok(());
        }
        let (idx, rpm) = (d.idx, d.rpm);
        let Some(h) = env.health.deployment(idx) else {
            return Ok(());
        };
        if let Some(until) = h.benched_until(env.now_ms) {
            self.note_soonest(until);
            return Err(SkipReason::Benched);
        }
        if let Some(rpm) = rpm {
            // The window is read, not reserved: concurrent requests can overshoot it by the
            // few that read it at once.
            if let Err(frees_s) = d.requests.check(env.wall_s, u64::from(rpm), 1) {
                let frees = env.now_ms.saturating_add(frees_s.saturating_mul(1_000));
                self.rpm_frees_ms = Some(self.rpm_frees_ms.map_or(frees, |s| s.min(frees)));
                return Err(SkipReason::RpmFull);
            }
        }
        match self.tokens_full(env, pos) {
            Some(Tokens::Never) => return Err(SkipReason::TokensExceedLimit),
            Some(Tokens::FreesIn(frees_s)) => {
                let frees = env.now_ms.saturating_add(frees_s.saturating_mul(1_000));
                self.rpm_frees_ms = Some(self.rpm_frees_ms.map_or(frees, |s| s.min(frees)));
                return Err(SkipReason::TpmFull);
            }
            None => {}
        }
        self.within_budgets(env, pos)
    }

    /// When the deployment's `tpm` window cannot take this request's estimated tokens: the
    /// seconds until it can, or never (the estimate alone is over the limit).
    fn tokens_full(&self, env: &PlanEnv<'_>, pos: usize) -> Option<Tokens> {
        let d = self.deployment(env.catalog, pos)?;
        let tpm = d.tpm?;
        let kind = env.catalog.provider(d.provider).kind;
        let estimate = self.facts.input_for(kind) + self.facts.output_tokens;
        if estimate > tpm {
            return Some(Tokens::Never);
        }
        d.tokens
            .check(env.wall_s, tpm, estimate)
            .err()
            .map(Tokens::FreesIn)
    }

    /// The deployment's and its provider's budgets, against what they spent in the period and
    /// this request's estimated cost on this deployment.
    fn within_budgets(&mut self, env: &PlanEnv<'_>, pos: usize) -> Result<(), SkipReason> {
        let Some(frees) = self.budget_spent_for(env, pos) else {
            return Ok(());
        };
        self.budget_frees_s = Some(self.budget_frees_s.map_or(frees, |s| s.min(frees)));
        Err(SkipReason::OverBudget)
    }

    /// When over a budget, the seconds until that budget's period ends.
    fn budget_spent_for(&self, env: &PlanEnv<'_>, pos: usize) -> Option<u64> {
        let d = self.deployment(env.catalog, pos)?;
        let p = env.catalog.provider(d.provider);
        if d.budget.is_none() && p.budget.is_none() {
            return None;
        }
        let input = self.facts.input_for(p.kind);
        let estimate = d.price.map_or(0, |price| {
            cost_micro_usd(&price, input, 0, self.facts.output_tokens)
        });
        [(d.budget, &d.spend), (p.budget, &p.spend)]
            .into_iter()
            .find_map(|(budget, spend)| {
                let b = budget?;
                let spent = spend.spent(b.period, env.wall_s);
                (spent >= b.micro_usd || spent + estimate > b.micro_usd)
                    .then(|| seconds_to_reset(b.period, env.wall_s))
            })
    }

    /// Record why no credential of a gated candidate could take the request now.
    fn note_unavailable(&mut self, env: &PlanEnv<'_>, pos: usize) {
        let Some(d) = self.deployment(env.catalog, pos) else {
            return;
        };
        let (provider_idx, dep) = (d.provider, d.model.map(|_| d.idx));
        let p = env.catalog.provider(provider_idx);
        let mut reason = None;
        for (ci, c) in p.credentials.iter().enumerate() {
            if !c.usable || self.tried.contains(&(pos, ci)) {
                continue;
            }
            let t = TargetRef {
                deployment: dep,
                provider: provider_idx,
                credential: ci,
            };
            let (why, until) = match env.health.admission(t, env.now_ms) {
                Admission::No(Unavailable::Ejected(u)) => (SkipReason::Ejected, Some(u)),
                Admission::No(Unavailable::CredentialCooling(u)) => {
                    (SkipReason::CredentialCooling, Some(u))
                }
                Admission::No(Unavailable::Benched(u)) => (SkipReason::Benched, Some(u)),
                Admission::No(Unavailable::ProbeBusy) | Admission::HalfOpen => {
                    (SkipReason::ProbeBusy, None)
                }
                Admission::Healthy { .. } => continue,
            };
            if let Some(u) = until {
                self.note_soonest(u);
            }
            reason = reason.or(Some(why));
        }
        if let Some(r) = reason {
            self.skip(pos, r);
        }
    }

    fn choice(
        (provider, deployment): (ProviderIdx, Option<DeploymentIdx>),
        pos: usize,
        ci: usize,
        probe: bool,
    ) -> Choice {
        Choice {
            target: Target {
                position: pos,
                credential: ci,
                probe,
            },
            health_ref: TargetRef {
                deployment,
                provider,
                credential: ci,
            },
            rotate: provider,
        }
    }

    /// Choose an untried credential of the deployment at `pos`, starting at the provider's
    /// rotation cursor.
    fn pick_credential(&mut self, env: &PlanEnv<'_>, pos: usize, pass: Pass) -> Option<Choice> {
        let d = self.deployment(env.catalog, pos)?;
        let d = (d.provider, d.model.map(|_| d.idx));
        let p = env.catalog.provider(d.0);
        let n = p.credentials.len();
        if n == 0 {
            return None;
        }
        let mut start = p.credential_cursor.load(Ordering::Relaxed);
        if p.credential_choice == CredentialChoice::LeastRemainingQuota {
            start = self.least_quota_first(env, pos, d.0, start);
        }
        // A recovering credential found on the way, taken only if no full-health one is.
        let mut recovering: Option<(usize, u32)> = None;
        let mut half_open: Option<usize> = None;
        for k in 0..n {
            let ci = (start + k) % n;
            if !p.credentials[ci].usable || self.tried.contains(&(pos, ci)) {
                continue;
            }
            let t = TargetRef {
                deployment: d.1,
                provider: d.0,
                credential: ci,
            };
            match env.health.admission(t, env.now_ms) {
                Admission::Healthy { health } => {
                    if pass == Pass::Deferred || health >= FULL_HEALTH || env.degraded {
                        return Some(Self::choice(d, pos, ci, false));
                    }
                    if recovering.is_none_or(|(_, h)| health > h) {
                        recovering = Some((ci, health));
                    }
                }
                Admission::HalfOpen if pass == Pass::InRank && !env.degraded => {
                    half_open = half_open.or(Some(ci));
                }
                _ => {}
            }
        }
        if pass == Pass::Deferred {
            return None;
        }
        if let Some((ci, health)) = recovering {
            // One draw per candidate: a restored deployment leads with probability = health.
            if self.draw_permille() < health {
                return Some(Self::choice(d, pos, ci, false));
            }
            if !self.deferred.contains(&pos) {
                self.deferred.push(pos);
            }
            return None;
        }
        half_open.map(|ci| Self::choice(d, pos, ci, true))
    }

    /// Under `least_remaining_quota`: the untried usable credential with the least quota left
    /// (requests, then tokens; a key without a fresh reading counts as full), ties to the
    /// first from the cursor. The walk then starts there and goes round as usual, so a key
    /// that cannot be admitted hands over to the next in rotation.
    fn least_quota_first(
        &self,
        env: &PlanEnv<'_>,
        pos: usize,
        provider: ProviderIdx,
        cursor: usize,
    ) -> usize {
        let p = env.catalog.provider(provider);
        let n = p.credentials.len();
        let mut best: Option<(usize, (u64, u64))> = None;
        for k in 0..n {
            let ci = (cursor + k) % n;
            if !p.credentials[ci].usable || self.tried.contains(&(pos, ci)) {
                continue;
            }
            let left = env
                .health
                .credential(provider, ci)
                .map_or((u64::MAX, u64::MAX), |c| c.quota_left(env.now_ms));
            if best.is_none_or(|(_, b)| left < b) {
                best = Some((ci, left));
            }
        }
        best.map_or(cursor, |(ci, _)| ci)
    }

    fn draw_permille(&mut self) -> u32 {
        self.rng = splitmix64(self.rng);
        u32::try_from(self.rng % u64::from(FULL_HEALTH)).unwrap_or(0)
    }

    fn draw(&mut self) -> u64 {
        self.rng = splitmix64(self.rng);
        self.rng
    }

    fn draw_unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let v = (self.draw() >> 11) as f64 / (1u64 << 53) as f64;
        v
    }

    /// How a candidate's credentials stand now: `Some(true)` when one has a closed breaker,
    /// `Some(false)` when none does but one is half-open with its probe slot free, `None`
    /// when it cannot take a request (or is not eligible).
    fn admissible_now(&mut self, env: &PlanEnv<'_>, pos: usize) -> Option<bool> {
        if let Some((at, standing)) = self.admissible_memo {
            if at == pos {
                return standing;
            }
        }
        let standing = self.admissible_uncached(env, pos);
        // Kept only while the first choice is decided (in the ranked phase, before
        // [`Self::decide_first`] sets `first`; it clears the memo on both ends): what the gate
        // notes (the soonest frees) is the same whichever call made it.
        if self.phase == Phase::Ranked && self.first.is_none() {
            self.admissible_memo = Some((pos, standing));
        }
        standing
    }

    fn admissible_uncached(&mut self, env: &PlanEnv<'_>, pos: usize) -> Option<bool> {
        self.gate(env, pos).ok()?;
        let d = self.deployment(env.catalog, pos)?;
        let p = env.catalog.provider(d.provider);
        let mut half_open = false;
        for (ci, c) in p.credentials.iter().enumerate() {
            if !c.usable {
                continue;
            }
            let t = TargetRef {
                deployment: d.model.map(|_| d.idx),
                provider: d.provider,
                credential: ci,
            };
            match env.health.admission(t, env.now_ms) {
                Admission::Healthy { .. } => return Some(true),
                Admission::HalfOpen => half_open = true,
                Admission::No(_) => {}
            }
        }
        (half_open && !env.degraded).then_some(false)
    }

    /// In-flight count and TTFB EWMA of a deployment, across its credentials.
    fn load(env: &PlanEnv<'_>, d: &Deployment) -> (u32, f64) {
        let p = env.catalog.provider(d.provider);
        let (mut in_flight, mut ttfb) = (0u32, f64::INFINITY);
        for ci in 0..p.credentials.len() {
            let t = TargetRef {
                deployment: d.model.map(|_| d.idx),
                provider: d.provider,
                credential: ci,
            };
            if let Some(th) = env.health.target(t) {
                in_flight = in_flight.saturating_add(th.in_flight.load(Ordering::Relaxed));
                if let Some(v) = th.ttfb_ms.get() {
                    ttfb = ttfb.min(v);
                }
            }
        }
        (in_flight, ttfb)
    }

    /// Decide the lead and the plan's first.
    fn decide_first(&mut self, env: &PlanEnv<'_>) {
        self.admissible_memo = None;
        self.lead = self.decide_lead(env);
        let first = self
            .lead
            .or_else(|| (0..self.len()).find(|&p| self.eligible(env, p).is_ok()));
        self.first_healthy = match first {
            Some(p) => self.admissible_now(env, p) == Some(true),
            None => false,
        };
        self.first = first;
        self.admissible_memo = None;
    }

    /// The per-request first choice, if the strategy or a session makes one.
    fn decide_lead(&mut self, env: &PlanEnv<'_>) -> Option<usize> {
        if let Candidates::Adhoc(_) = self.candidates {
            return None;
        }
        if let Some(bound) = self.facts.session {
            let all: Vec<usize> = (0..self.len())
                .filter(|&p| self.admissible_now(env, p) == Some(true))
                .collect();
            let catalog = env.catalog;
            let pick = lead::sticky(&all, |p| {
                self.deployment(catalog, p)
                    .is_some_and(|d| session_tag(d.key_hash) == bound)
            });
            if pick.is_some() {
                return pick;
            }
        }
        if env.degraded {
            return None;
        }
        if is_learned(self.strategy) {
            let roll = self.draw_unit();
            let r = self.draw();
            let healthy: Vec<usize> = (0..self.len().min(self.lead_span))
                .filter(|&p| self.admissible_now(env, p) == Some(true))
                .collect();
            let catalog = env.catalog;
            return lead::explore(
                &healthy,
                |p| {
                    self.deployment(catalog, p)
                        .is_some_and(|d| Self::load(env, d).1.is_finite())
                },
                roll,
                r,
            );
        }
        let by_cost = matches!(
            self.strategy,
            Strategy::Cheapest | Strategy::PriorityCheapest
        );
        if !(self.strategy.is_load_balancing() || by_cost) {
            return None;
        }
        let tier = self.tier(env);
        if tier.is_empty() {
            return None;
        }
        let r = self.draw();
        let unit = self.draw_unit();
        let catalog = env.catalog;
        let dep = |p: usize| self.deployment(catalog, p);
        match self.strategy {
            Strategy::Cheapest | Strategy::PriorityCheapest => {
                let (i, o) = (self.facts.input_tokens, self.facts.output_tokens);
                lead::cheapest(&tier, |p| dep(p).map_or(u64::MAX, |d| cost_micro(d, i, o)))
            }
            Strategy::RoundRobin => lead::round_robin(&tier, self.facts.round_robin),
            Strategy::Random => lead::random(&tier, r),
            Strategy::LeastInflight => {
                lead::least_inflight(&tier, |p| dep(p).map_or(u32::MAX, |d| Self::load(env, d).0))
            }
            Strategy::P2cEwma => lead::p2c(&tier, r, |p| {
                dep(p).map_or(f64::INFINITY, |d| {
                    let (in_flight, ttfb) = Self::load(env, d);
                    // Unknown latency: assume a second, so unmeasured targets get tried.
                    let ttfb = if ttfb.is_finite() { ttfb } else { 1000.0 };
                    ttfb * f64::from(in_flight + 1)
                })
            }),
            Strategy::Weighted => lead::weighted(&tier, |p| dep(p).and_then(|d| d.weight), unit),
            Strategy::PrefixAffinity => {
                let key = self.facts.prefix_hash?;
                lead::prefix_affinity(&tier, key, |p| dep(p).map_or(0, |d| d.key_hash))
            }
            _ => None,
        }
    }

    /// The candidates that may lead: admissible now (a closed breaker, or a half-open one
    /// whose probe is free: it keeps its place among its peers), of the best priority among
    /// them. The ranked order is priority-first for these strategies, so the scan stops at
    /// the first worse priority. The weighted draw and plain `cheapest` span every admissible
    /// candidate.
    fn tier(&mut self, env: &PlanEnv<'_>) -> Vec<usize> {
        let whole = matches!(self.strategy, Strategy::Weighted | Strategy::Cheapest);
        let span = self.len().min(self.lead_span);
        let mut tier = Vec::with_capacity(span.min(16));
        let mut best: Option<i32> = None;
        for pos in 0..span {
            let Some(priority) = self.deployment(env.catalog, pos).map(|d| d.priority) else {
                continue;
            };
            if !whole && best.is_some_and(|b| priority > b) {
                break;
            }
            if self.admissible_now(env, pos).is_some() {
                best.get_or_insert(priority);
                tier.push(pos);
            }
        }
        tier
    }
}

/// Strategies that order by what live traffic measured: they need exploration, or a
/// candidate that was never tried would never be measured.
fn is_learned(s: Strategy) -> bool {
    matches!(
        s,
        Strategy::Fastest
            | Strategy::Reliable
            | Strategy::Balanced
            | Strategy::Smartest
            | Strategy::Custom
    )
}

/// The part of a deployment's identity hash a sticky session records.
pub fn session_tag(key_hash: u64) -> u64 {
    key_hash >> 40
}

/// The prompt-prefix hash for `prefix_affinity`.
pub fn prefix_hash(prompt: &[u8], prefix_bytes: usize) -> u64 {
    stable_hash(&prompt[..prompt.len().min(prefix_bytes)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Outcome;
    use crate::testing::Fixture;
    use std::collections::HashMap;
    use std::time::Duration;

    fn kit(text: &str) -> Fixture {
        Fixture::with_health(text, |h| h.failure_threshold = 1)
    }

    fn plan(k: &Fixture, strategy: Strategy, facts: RequestFacts) -> Plan {
        Plan::new(k.deployments(), strategy, facts)
    }

    fn name(k: &Fixture, p: &Plan, t: Target) -> String {
        p.deployment(&k.catalog, t.position)
            .map(|d| d.upstream_model.to_string())
            .unwrap_or_default()
    }

    /// What the proxy does with a choice: claim a probe slot (moving on when it is taken),
    /// then commit. Credential cursors are left alone (tests read one credential order).
    fn take(k: &Fixture, p: &mut Plan, env: &PlanEnv<'_>, advance: Advance) -> Option<Target> {
        let mut advance = advance;
        loop {
            let c = p.next(env, advance)?;
            if c.target.probe {
                match k.health.try_claim_probe(c.health_ref) {
                    // The probe stays in flight for the rest of the test.
                    Some(claim) => std::mem::forget(claim),
                    None => {
                        p.probe_lost(&c);
                        advance = Advance::NextDeployment;
                        continue;
                    }
                }
            }
            p.commit(&c);
            return Some(c.target);
        }
    }

    /// The upstream model of the first target for each of `n` requests.
    fn firsts(
        k: &Fixture,
        n: usize,
        strategy: Strategy,
        facts: impl Fn(usize) -> RequestFacts,
    ) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for i in 0..n {
            let mut p = plan(k, strategy, facts(i));
            let t = take(k, &mut p, &k.env(false), Advance::NextDeployment).expect("a target");
            *counts.entry(name(k, &p, t)).or_insert(0) += 1;
        }
        counts
    }

    /// Every target of a plan walked with `NextDeployment`: (upstream model, probe).
    fn walk(k: &Fixture, p: &mut Plan, degraded: bool) -> Vec<(String, bool)> {
        let env = k.env(degraded);
        let mut out = Vec::new();
        while let Some(t) = take(k, p, &env, Advance::NextDeployment) {
            out.push((name(k, p, t), t.probe));
        }
        out
    }

    fn names(k: &Fixture, p: &mut Plan, degraded: bool) -> Vec<String> {
        walk(k, p, degraded).into_iter().map(|(n, _)| n).collect()
    }

    fn fail(k: &Fixture, upstream: &str, c: usize) {
        k.observe(k.target(upstream, c), Outcome::ServerError);
    }

    fn seeded(i: usize) -> RequestFacts {
        RequestFacts {
            seed: i as u64 * 7919 + 1,
            round_robin: i,
            ..RequestFacts::default()
        }
    }

    const POOL: &str = r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }] }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
  c: { kind: openai, base_url: "http://127.0.0.1:3/v1" }
models:
  m:
    deployments:
      - { provider: a, model: x, weight: 7, price: { input_per_mtok: 1.0, output_per_mtok: 10.0 } }
      - { provider: b, model: y, weight: 3, price: { input_per_mtok: 3.0, output_per_mtok: 2.0 } }
      - { provider: c, model: z, priority: 20 }
"#;

    #[test]
    fn walks_candidates_then_credentials() {
        let k = kit(POOL);
        let env = k.env(false);
        let mut p = plan(&k, Strategy::Priority, RequestFacts::default());
        let first = take(&k, &mut p, &env, Advance::NextDeployment).expect("first");
        assert_eq!(name(&k, &p, first), "x");
        // A credential failure on a two-key provider tries its other key first.
        let second = take(&k, &mut p, &env, Advance::NextCredential).expect("second");
        assert_eq!(
            (second.position, name(&k, &p, second)),
            (first.position, "x".into())
        );
        assert_ne!(second.credential, first.credential);
        // Both keys used: the walk moves on.
        let third = take(&k, &mut p, &env, Advance::NextCredential).expect("third");
        assert_eq!(name(&k, &p, third), "y");
        let fourth = take(&k, &mut p, &env, Advance::NextDeployment).expect("fourth");
        assert_eq!(name(&k, &p, fourth), "z");
        assert_eq!(take(&k, &mut p, &env, Advance::NextDeployment), None);
        assert_eq!(p.first_position(), Some(first.position));
    }

    #[test]
    fn next_changes_nothing_outside_the_plan() {
        let k = kit(POOL);
        fail(&k, "x", 0);
        fail(&k, "x", 1);
        k.clock.advance(Duration::from_secs(31));
        let cursor = |k: &Fixture| {
            k.catalog.providers[1]
                .credential_cursor
                .load(Ordering::Relaxed)
        };
        let before = cursor(&k);
        let mut p = plan(&k, Strategy::Priority, RequestFacts::default());
        let c = p
            .next(&k.env(false), Advance::NextDeployment)
            .expect("a choice");
        // x is half-open: it keeps its ranked place as a probe, which the plan did not claim.
        assert!(c.target.probe, "{c:?}");
        assert!(
            k.health.try_claim_probe(c.health_ref).is_some(),
            "the slot is still free"
        );
        assert_eq!(cursor(&k), before);
    }

    /// POOL with one key per provider: one target per deployment.
    fn one_key_pool() -> Fixture {
        kit(&POOL.replace(
            ", credentials: [{ id: k1, key_env: K1 }, { id: k2, key_env: K2 }]",
            "",
        ))
    }

    #[test]
    fn ejected_candidates_are_skipped_and_a_half_open_one_probes_in_its_ranked_place() {
        let k = one_key_pool();
        fail(&k, "x", 0);
        let mut p = plan(&k, Strategy::Priority, RequestFacts::default());
        assert_eq!(
            names(&k, &mut p, false),
            ["y", "z"],
            "inside its cooldown x is not called"
        );
        assert_eq!(p.skipped(SkipReason::Ejected), 1);
        assert_eq!(p.first_position(), Some(0), "x is still the plan's first");
        assert!(!p.first_was_healthy());
        // After the cooldown x is half-open: it keeps its first place for one request.
        k.clock.advance(Duration::from_secs(31));
        let mut p1 = plan(&k, Strategy::Priority, RequestFacts::default());
        let order = walk(&k, &mut p1, false);
        assert_eq!(order.first(), Some(&("x".to_string(), true)), "{order:?}");
        // A concurrent request cannot take the same probe: it starts at y.
        let mut p2 = plan(&k, Strategy::Priority, RequestFacts::default());
        assert_eq!(names(&k, &mut p2, false), ["y", "z"]);
    }

    #[test]
    fn one_probe_among_sixty_four_concurrent_requests() {
        let k = one_key_pool();
        fail(&k, "x", 0);
        k.clock.advance(Duration::from_secs(31));
        // 64 requests plan at once (none finishes): exactly one probes x.
        let mut probes = 0;
        let mut served = HashMap::new();
        let env = k.env(false);
        for i in 0..64 {
            let mut p = plan(&k, Strategy::Priority, seeded(i));
            let t = take(&k, &mut p, &env, Advance::NextDeployment).expect("a target");
            probes += usize::from(t.probe);
            *served.entry(name(&k, &p, t)).or_insert(0) += 1;
        }
        assert_eq!(probes, 1);
        assert_eq!(served.get("x"), Some(&1), "{served:?}");
        assert_eq!(served.get("y"), Some(&63), "{served:?}");
    }

    #[test]
    fn every_candidate_ejected_fails_fast_with_the_soonest_end() {
        let k = kit(POOL);
        fail(&k, "x", 0);
        fail(&k, "x", 1);
        k.clock.advance(Duration::from_secs(5));
        fail(&k, "y", 0);
        fail(&k, "z", 0);
        let mut p = plan(&k, Strategy::Priority, RequestFacts::default());
        assert_eq!(p.next(&k.env(false), Advance::NextDeployment), None);
        let soonest = p.soonest_ms().expect("soonest");
        assert_eq!(
            soonest - k.shared.now_ms(),
            25_000,
            "x frees first, 25 s from now"
        );
        assert!(p.skipped(SkipReason::Ejected) >= 3);
        assert_eq!(p.no_call(), NoCall::Unavailable);
    }

    #[test]
    fn weighted_splits_seven_to_three() {
        let k = kit(POOL);
        let counts = firsts(&k, 2000, Strategy::Weighted, seeded);
        let x = counts.get("x").copied().unwrap_or(0);
        let y = counts.get("y").copied().unwrap_or(0);
        assert_eq!(x + y, 2000, "the unweighted z never leads: {counts:?}");
        let share = x as f64 / 2000.0;
        assert!((share - 0.7).abs() < 0.04, "x share {share}");
        // The failure order continues through the rest, unweighted z included.
        let mut p = plan(&k, Strategy::Weighted, seeded(1));
        let all = names(&k, &mut p, false);
        assert!(all.contains(&"z".to_string()), "{all:?}");
    }

    #[test]
    fn the_lead_pick_is_the_plans_first() {
        let k = kit(POOL);
        for i in 0..20 {
            let mut p = plan(&k, Strategy::RoundRobin, seeded(i));
            let t = take(&k, &mut p, &k.env(false), Advance::NextDeployment).expect("target");
            assert_eq!(p.first_position(), Some(t.position), "request {i}");
            assert!(p.first_was_healthy());
        }
    }

    #[test]
    fn round_robin_and_random_spread_across_the_best_tier() {
        let k = kit(POOL);
        let rr = firsts(&k, 100, Strategy::RoundRobin, seeded);
        assert_eq!(
            (rr.get("x"), rr.get("y"), rr.get("z")),
            (Some(&50), Some(&50), None),
            "{rr:?}"
        );
        let random = firsts(&k, 2000, Strategy::Random, seeded);
        let x = random.get("x").copied().unwrap_or(0);
        assert!((900..=1100).contains(&x), "{random:?}");
    }

    #[test]
    fn least_inflight_and_p2c_prefer_the_less_loaded() {
        let k = kit(POOL);
        let _guards: Vec<_> = (0..3)
            .map(|_| k.health.begin(k.target("x", 0), None))
            .collect();
        let least = firsts(&k, 50, Strategy::LeastInflight, seeded);
        assert_eq!(least.get("y"), Some(&50), "{least:?}");
        // p2c over two candidates always compares both: the idle one wins.
        let p2c = firsts(&k, 50, Strategy::P2cEwma, seeded);
        assert_eq!(p2c.get("y"), Some(&50), "{p2c:?}");
    }

    #[test]
    fn prefix_affinity_is_stable_per_prompt_and_spreads_across_prompts() {
        let k = kit(POOL);
        let facts = |i: usize| RequestFacts {
            prefix_hash: Some(prefix_hash(format!("prompt {}", i % 20).as_bytes(), 1024)),
            ..seeded(i)
        };
        let mut seen: HashMap<usize, String> = HashMap::new();
        for i in 0..200 {
            let mut p = plan(&k, Strategy::PrefixAffinity, facts(i));
            let t = take(&k, &mut p, &k.env(false), Advance::NextDeployment).expect("target");
            let n = name(&k, &p, t);
            if let Some(prev) = seen.insert(i % 20, n.clone()) {
                assert_eq!(prev, n, "the same prefix moved");
            }
        }
        let distinct: std::collections::HashSet<_> = seen.values().collect();
        assert_eq!(
            distinct.len(),
            2,
            "20 prompts spread over both equivalent deployments"
        );
    }

    #[test]
    fn sticky_sessions_lead_while_healthy() {
        let k = kit(POOL);
        let z = k
            .catalog
            .deployment(k.target("z", 0).deployment.expect("z"));
        let facts = RequestFacts {
            session: Some(session_tag(z.key_hash)),
            ..RequestFacts::default()
        };
        let mut p = plan(&k, Strategy::Priority, facts);
        let t = take(&k, &mut p, &k.env(false), Advance::NextDeployment).expect("target");
        assert_eq!(name(&k, &p, t), "z");
        fail(&k, "z", 0);
        let mut p = plan(&k, Strategy::Priority, facts);
        let t = take(&k, &mut p, &k.env(false), Advance::NextDeployment).expect("target");
        assert_eq!(
            name(&k, &p, t),
            "x",
            "an ejected session target does not lead"
        );
    }

    #[test]
    fn cheapest_uses_this_requests_tokens() {
        let k = kit(POOL);
        // Input-heavy: x is cheaper (1.0 in); output-heavy: y is cheaper (2.0 out). The
        // unpriced z would count as free, so it is left out of the pool.
        let cost_pool: Arc<[DeploymentIdx]> = Arc::from(vec![DeploymentIdx(0), DeploymentIdx(1)]);
        let first = |i, o| {
            let mut p = Plan::new(
                cost_pool.clone(),
                Strategy::Cheapest,
                RequestFacts {
                    input_tokens: i,
                    output_tokens: o,
                    ..RequestFacts::default()
                },
            );
            let t = take(&k, &mut p, &k.env(false), Advance::NextDeployment).expect("target");
            name(&k, &p, t)
        };
        assert_eq!(first(10_000, 10), "x");
        assert_eq!(first(10, 10_000), "y");
    }

    #[test]
    fn degraded_mode_turns_exploration_off() {
        let k = kit(POOL);
        let mut counts: HashMap<String, usize> = HashMap::new();
        for i in 0..100 {
            let mut p = plan(&k, Strategy::Random, seeded(i));
            let t = take(&k, &mut p, &k.env(true), Advance::NextDeployment).expect("target");
            *counts.entry(name(&k, &p, t)).or_insert(0) += 1;
        }
        assert_eq!(
            counts.get("x"),
            Some(&100),
            "the scored order only: {counts:?}"
        );
        // No half-open probes either.
        fail(&k, "z", 0);
        k.clock.advance(Duration::from_secs(31));
        let mut p = plan(&k, Strategy::Priority, RequestFacts::default());
        let names = names(&k, &mut p, true);
        assert!(!names.contains(&"z".to_string()), "{names:?}");
    }

    #[test]
    fn a_restored_target_earns_its_share_back() {
        let k = kit(POOL);
        // Restore x at 0.5 health: it leads about half the time, the rest go to y first.
        fail(&k, "x", 0);
        fail(&k, "x", 1);
        for c in 0..2 {
            k.health
                .target(k.target("x", c))
                .expect("target")
                .restore(&k.health.policy);
        }
        let counts = firsts(&k, 2000, Strategy::Priority, seeded);
        let x = counts.get("x").copied().unwrap_or(0) as f64 / 2000.0;
        assert!((x - 0.5).abs() < 0.05, "x leads {x} of the time");
    }
}
