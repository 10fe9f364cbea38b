//! Guardrails (DESIGN §10): checks of a caller's input text that run once per request, after
//! admission and before the first attempt, whichever driver then serves it.
//!
//! This module owns the compiled profiles of one snapshot ([`Guardrails`]), which of them a
//! request runs and in what mode ([`Guardrails::wanted`]: the selected policy's mandated
//! entries plus the caller's `x-llm-guardrails: a,b:monitor`, the stricter mode winning when
//! both name a profile, so a caller can add checks but never remove or soften one), and what
//! their results do ([`run`]: block → 400 `guardrail_blocked`, an unavailable check under
//! `on_unavailable: block` → 503 `guardrail_unavailable`, everything else served with
//! `x-llm-guardrails: <profile>=flagged|passed|unavailable`).
//!
//! - [`patterns`]: regexes over the text, in process;
//! - [`moderation`]: a provider's `/moderations` endpoint, called directly (not through the
//!   plan) with the provider's credential;
//! - [`classifier`]: a catalog chat model asked through the gateway's own plan
//!   (`crate::internal`);
//! - [`run`]: every profile in parallel, each bounded by its `timeout`, and the decision.
//!
//! Cost: a snapshot without `guardrails` holds `None` and a request pays one `Option` check.
//! With profiles defined, a request whose policy mandates none and that sends no
//! `x-llm-guardrails` header pays a header lookup. The input text is extracted (one more parse
//! of the prompt's spans) only when a profile runs, and it is never logged, counted or echoed:
//! results name profiles only. Internal requests (the gateway asking itself) run none.

pub mod classifier;
pub mod moderation;
pub mod patterns;
pub mod run;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;

use crate::catalog::ProviderIdx;
use crate::config::{GuardrailCheck, GuardrailMode, GuardrailUse, GuardrailsConfig};
use crate::error::{ErrorCode, GatewayError};

pub use run::{run, Decision};

/// The request header naming profiles a caller adds, and the response header reporting them.
pub const HEADER: HeaderName = HeaderName::from_static("x-llm-guardrails");

/// The most profiles one `x-llm-guardrails` header may name.
const MAX_HEADER_PROFILES: usize = 16;

/// One snapshot's guardrails.
#[derive(Debug)]
pub struct Guardrails {
    pub profiles: Vec<Profile>,
    /// By policy index: what each policy mandates.
    policies: Vec<Vec<GuardrailUse>>,
}

/// One compiled profile.
#[derive(Debug)]
pub struct Profile {
    pub name: Arc<str>,
    pub check: Check,
    pub timeout: Duration,
    /// `signalbox_guardrail_checks_total{profile=name}`, by [`Outcome::index`].
    counters: [IntCounter; 3],
}

/// What a profile checks.
#[derive(Debug)]
pub enum Check {
    Patterns(Vec<regex::Regex>),
    Moderation {
        provider: ProviderIdx,
        /// `<base_url path>/moderations`.
        path: Arc<str>,
        model: Arc<str>,
    },
    Classifier {
        model: Arc<str>,
        prompt: Arc<str>,
        flag_on: Arc<str>,
    },
}

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Flagged,
    Passed,
    /// It errored or ran out of time.
    Unavailable,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Flagged, Outcome::Passed, Outcome::Unavailable];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Flagged => "flagged",
            Outcome::Passed => "passed",
            Outcome::Unavailable => "unavailable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl Profile {
    /// Count one check's outcome.
    pub fn count(&self, outcome: Outcome) {
        self.counters[outcome.index()].inc();
    }
}

impl Guardrails {
    /// Compile `config`'s profiles, their counters resolved in `checks` (the series exist
    /// from the start, at zero). Moderation profiles find their provider's path in
    /// `base_paths` (by provider index).
    pub fn build(
        config: &GuardrailsConfig,
        base_paths: &[&str],
        checks: &prometheus::IntCounterVec,
    ) -> Self {
        let profiles = config
            .profiles
            .iter()
            .map(|p| {
                let check = match &p.check {
                    GuardrailCheck::Patterns(res) => Check::Patterns(res.clone()),
                    GuardrailCheck::Moderation { provider, model } => Check::Moderation {
                        provider: ProviderIdx(u32::try_from(*provider).unwrap_or(u32::MAX)),
                        path: Arc::from(format!(
                            "{}/moderations",
                            base_paths.get(*provider).copied().unwrap_or("")
                        )),
                        model: Arc::from(model.as_str()),
                    },
                    GuardrailCheck::Classifier {
                        model,
                        prompt,
                        flag_on,
                    } => Check::Classifier {
                        model: Arc::from(model.as_str()),
                        prompt: Arc::from(prompt.as_str()),
                        flag_on: Arc::from(flag_on.as_str()),
                    },
                };
                Profile {
                    name: Arc::from(p.name.as_str()),
                    check,
                    timeout: p.timeout,
                    counters: Outcome::ALL
                        .map(|o| checks.with_label_values(&[p.name.as_str(), o.as_str()])),
                }
            })
            .collect();
        Self {
            profiles,
            policies: config.policies.clone(),
        }
    }

    /// The profile named `name`.
    fn find(&self, name: &str) -> Option<usize> {
        self.profiles.iter().position(|p| &*p.name == name)
    }

    /// What policy `policy` mandates (nothing for another route).
    pub fn mandated(&self, policy: Option<usize>) -> &[GuardrailUse] {
        policy
            .and_then(|p| self.policies.get(p))
            .map_or(&[], Vec::as_slice)
    }

    /// The profiles a request runs, in order: the policy's, then those the caller's header
    /// adds. A profile both name runs once, in the stricter mode of the two (and the stricter
    /// `on_unavailable`). A caller's profile fails closed when it cannot run. An unknown
    /// profile or mode in the header is the caller's 400.
    pub fn wanted(
        &self,
        policy: Option<usize>,
        header: Option<&[u8]>,
    ) -> Result<Vec<GuardrailUse>, GatewayError> {
        let mut wanted: Vec<GuardrailUse> = self.mandated(policy).to_vec();
        let Some(header) = header else {
            return Ok(wanted);
        };
        let bad = |why: String| GatewayError::new(ErrorCode::GuardrailNotFound, why);
        let text = std::str::from_utf8(header)
            .map_err(|_| bad("`x-llm-guardrails` must be ASCII profile names".to_string()))?;
        let mut named = 0;
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            named += 1;
            if named > MAX_HEADER_PROFILES {
                return Err(bad(format!(
                    "`x-llm-guardrails` names more than {MAX_HEADER_PROFILES} profiles"
                )));
            }
            let (name, mode) = match item.split_once(':') {
                None => (item, GuardrailMode::Block),
                Some((name, "monitor")) => (name.trim(), GuardrailMode::Monitor),
                Some((name, "block")) => (name.trim(), GuardrailMode::Block),
                Some(_) => {
                    return Err(bad(
                        "`x-llm-guardrails`: a profile's mode is `:block` or `:monitor`"
                            .to_string(),
                    ))
                }
            };
            // A name from the header is echoed only when it is a configured one.
            let Some(profile) = self.find(name) else {
                return Err(bad(
                    "`x-llm-guardrails` names a guardrail profile that is not configured"
                        .to_string(),
                ));
            };
            let asked = GuardrailUse {
                profile,
                mode,
                on_unavailable: GuardrailMode::Block,
            };
            match wanted.iter_mut().find(|w| w.profile == profile) {
                Some(w) => {
                    w.mode = w.mode.max(asked.mode);
                    w.on_unavailable = w.on_unavailable.max(asked.on_unavailable);
                }
                None => wanted.push(asked),
            }
        }
        Ok(wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guardrails(policies: Vec<Vec<GuardrailUse>>) -> Guardrails {
        let checks = prometheus::IntCounterVec::new(
            prometheus::Opts::new("t_checks", "t"),
            &["profile", "result"],
        )
        .expect("metric");
        let profile = |name: &str| Profile {
            name: Arc::from(name),
            check: Check::Patterns(Vec::new()),
            timeout: Duration::from_secs(1),
            counters: Outcome::ALL.map(|o| checks.with_label_values(&[name, o.as_str()])),
        };
        Guardrails {
            profiles: vec![profile("a"), profile("b")],
            policies,
        }
    }

    const MONITOR_A: GuardrailUse = GuardrailUse {
        profile: 0,
        mode: GuardrailMode::Monitor,
        on_unavailable: GuardrailMode::Monitor,
    };

    #[test]
    fn a_caller_adds_profiles_but_never_softens_a_policys() {
        let block_a = GuardrailUse {
            mode: GuardrailMode::Block,
            ..MONITOR_A
        };
        let g = guardrails(vec![vec![block_a]]);
        // The policy's block stays a block however the caller names it.
        let w = g
            .wanted(Some(0), Some(b"a:monitor, b:monitor"))
            .expect("ok");
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].mode, GuardrailMode::Block);
        // The caller's entry fails closed: the stricter of the two `on_unavailable`s.
        assert_eq!(w[0].on_unavailable, GuardrailMode::Block);
        assert_eq!(w[1].profile, 1);
        assert_eq!(w[1].mode, GuardrailMode::Monitor);
        assert_eq!(w[1].on_unavailable, GuardrailMode::Block);
        // Nothing in the header removes it.
        assert_eq!(g.wanted(Some(0), Some(b"")).expect("ok"), vec![block_a]);
    }

    #[test]
    fn a_caller_may_tighten_a_monitored_profile() {
        let g = guardrails(vec![vec![MONITOR_A]]);
        let w = g.wanted(Some(0), Some(b"a")).expect("ok");
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].mode, GuardrailMode::Block);
        assert_eq!(w[0].on_unavailable, GuardrailMode::Block);
        assert!(g.wanted(None, None).expect("ok").is_empty());
    }

    #[test]
    fn unknown_profiles_and_modes_are_the_callers_400() {
        let g = guardrails(vec![]);
        for bad in [&b"zzz"[..], b"a:loud", b"a,\xff"] {
            let e = g.wanted(None, Some(bad)).expect_err("refused");
            assert_eq!(e.code, ErrorCode::GuardrailNotFound);
            assert_eq!(e.status, 400);
            assert!(!e.message.contains("zzz"), "the unknown name is not echoed");
        }
    }
}
