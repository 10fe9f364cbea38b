//! Client keys: who is calling, what they may name, and how much they may use.
//!
//! With a `keys` section every proxied request (and `GET /v1/models`) carries a key,
//! `Authorization: Bearer <key>` or `x-api-key: <key>` (both SDKs' ways). The table holds only
//! sha256 digests: the presented key is hashed, found by its digest, and compared in constant
//! time, so neither the key nor its digest leaves a trace in timing, logs or metrics. A key
//! limits the names it may send (`allowed_models` globs over `model`, `routing.policy`,
//! `x-llm-route`), its requests and tokens per minute and its spend over a calendar period
//! (counters from [`crate::limits`]); all of it is checked before any candidate is considered.
//! A key may also carry its own routing ([`KeyRouting`]: strategy, provider order, exclusions,
//! attempt bound), compiled here with the table.
//!
//! Counters live in a [`KeyState`] shared across reloads by key id, so a reload neither
//! forgets a minute's requests nor refunds a month's spend.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::adapters::caller::CallerRequest;
use crate::config::{BudgetConfig, ClientKeyConfig, ClientKeySource};
pub use crate::limits::budget::cost_micro_usd;
use crate::limits::budget::Spend;
use crate::limits::hold::Reserved;
use crate::limits::window::Window;
use crate::routing::key::KeyRouting;

/// Output tokens assumed for a request that sets no `max_tokens` (DESIGN §8).
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 256;

/// A key's counters: kept across reloads for as long as the key id exists.
#[derive(Debug, Default)]
pub struct KeyState {
    pub requests: Window,
    pub tokens: Window,
    pub spend: Spend,
}

/// One client key.
#[derive(Debug)]
pub struct ClientKey {
    pub id: Arc<str>,
    /// Its position in the config's `keys` (its label index under `metrics.per_key`).
    pub metric: usize,
    pub user: Option<Arc<str>>,
    digest: [u8; 32],
    /// Lower-cased globs; `None`: every name.
    allowed: Option<Vec<Box<str>>>,
    /// Per catalog model (by index): whether the globs match its name. A candidate whose model
    /// the key may not use is skipped, wherever the plan took it from. `None`: every model.
    models: Option<Arc<[bool]>>,
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
    pub budget: Option<BudgetConfig>,
    pub state: Arc<KeyState>,
    /// Its user's budget (`budgets.users.<user>`), shared by every key of that user.
    pub user_budget: Option<(BudgetConfig, Arc<Spend>)>,
    /// Its own routing (`routing`), resolved against this snapshot's providers.
    pub routing: Option<KeyRouting>,
}

/// Why a key may not send a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over its rpm or tpm: seconds until the window frees.
    RateLimited(u64),
    /// Its budget is spent: seconds until the period ends.
    BudgetExceeded(u64),
}

/// What a key holds for one admitted request: the tokens reserved in its window, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub at_s: u64,
    pub tokens: u64,
}

impl ClientKey {
    /// Whether the key may send `name` (compared lower-cased).
    pub fn allows(&self, name: &str) -> bool {
        let Some(globs) = &self.allowed else {
            return true;
        };
        let mut buf = [0u8; 256];
        let lower: &[u8] = if name.len() <= buf.len() {
            let b = &mut buf[..name.len()];
            b.copy_from_slice(name.as_bytes());
            b.make_ascii_lowercase();
            b
        } else {
            return globs
                .iter()
                .any(|g| crate::glob::matches(g.as_bytes(), name.to_lowercase().as_bytes()));
        };
        globs
            .iter()
            .any(|g| crate::glob::matches(g.as_bytes(), lower))
    }

    /// Which catalog models (by index) the key may be served by; `None`: all of them.
    pub fn models(&self) -> Option<&Arc<[bool]>> {
        self.models.as_ref()
    }

    /// Whether the key may be served by catalog model `model` (its index).
    pub fn may_use(&self, model: usize) -> bool {
        self.models
            .as_ref()
            .is_none_or(|m| m.get(model).copied().unwrap_or(false))
    }

    /// Whether the key may send a request naming these: its `model`, its `routing.policy`, and
    /// the `x-llm-route` header (any of them may name a policy).
    pub fn allows_request(&self, request: &CallerRequest, route_header: Option<&[u8]>) -> bool {
        let policy = request.routing().and_then(|r| r.policy.as_deref());
        let route = route_header.and_then(|h| std::str::from_utf8(h).ok());
        [Some(&*request.model_name()), policy, route]
            .iter()
            .flatten()
            .all(|name| self.allows(name))
    }

    /// Admit one request estimated at `tokens` at `now_s`: every limit checked first, then the
    /// request and its tokens counted (a refused request consumes nothing).
    pub fn admit(&self, now_s: u64, tokens: u64) -> Result<Reservation, Refusal> {
        let s = &self.state;
        if let Some(budget) = &self.budget {
            s.spend
                .check(budget, now_s)
                .map_err(Refusal::BudgetExceeded)?;
        }
        if let Some((budget, spend)) = &self.user_budget {
            spend
                .check(budget, now_s)
                .map_err(Refusal::BudgetExceeded)?;
        }
        if let Some(rpm) = self.rpm {
            s.requests
                .check(now_s, u64::from(rpm), 1)
                .map_err(Refusal::RateLimited)?;
        }
        if let Some(tpm) = self.tpm {
            s.tokens
                .check(now_s, tpm, tokens)
                .map_err(Refusal::RateLimited)?;
        }
        s.requests.add(now_s, 1);
        s.tokens.add(now_s, tokens);
        Ok(Reservation {
            at_s: now_s,
            tokens,
        })
    }

    /// Count a request the shared store admitted (it already holds it): its request and
    /// tokens, and the estimated cost it reserved in the key's and its user's budgets, as the
    /// store does, so the sync does not push them again.
    pub fn admitted_shared(&self, now_s: u64, tokens: u64, cost: u64) -> Reservation {
        let s = &self.state;
        if let Some(budget) = &self.budget {
            s.spend.add_pushed(budget.period, now_s, cost);
        }
        if let Some((budget, spend)) = &self.user_budget {
            spend.add_pushed(budget.period, now_s, cost);
        }
        if self.rpm.is_some() {
            s.requests.add_pushed(now_s, 1);
        } else {
            s.requests.add(now_s, 1);
        }
        if self.tpm.is_some() {
            s.tokens.add_pushed(now_s, tokens);
        } else {
            s.tokens.add(now_s, tokens);
        }
        Reservation {
            at_s: now_s,
            tokens,
        }
    }

    /// Settle a request: its tokens as reported (`None`: the estimate stands) and what it cost
    /// (`None`: unknown). A cost reserved at admission settles to what it cost (unknown: the
    /// estimate stands); otherwise what it cost is spent.
    pub fn settle(
        &self,
        reservation: Reservation,
        now_s: u64,
        used: Option<u64>,
        cost: Option<u64>,
        reserved: Option<Reserved>,
    ) {
        let s = &self.state;
        if let Some(used) = used {
            if used < reservation.tokens {
                s.tokens.sub(reservation.at_s, reservation.tokens - used);
            } else {
                s.tokens.add(now_s, used - reservation.tokens);
            }
        }
        let budgets = [
            self.budget.as_ref().map(|b| (b, &s.spend)),
            self.user_budget.as_ref().map(|(b, spend)| (b, &**spend)),
        ];
        for (budget, spend) in budgets.into_iter().flatten() {
            match reserved {
                Some(r) => r.settle_spend(spend, budget.period, now_s, cost),
                None => {
                    if let Some(c) = cost.filter(|c| *c > 0) {
                        spend.add(budget.period, now_s, c);
                    }
                }
            }
        }
    }

    /// `budget.used_pct` and `budget.remaining_usd`, when the key has a budget.
    pub fn budget_facts(&self, now_s: u64) -> Option<(f64, f64)> {
        self.budget.as_ref().map(|b| {
            (
                self.state.spend.used_pct(b, now_s),
                self.state.spend.remaining_usd(b, now_s),
            )
        })
    }
}

/// The key a request presents: `Authorization: Bearer <key>`, else `x-api-key: <key>`.
pub fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(http::header::AUTHORIZATION) {
        let v = v.as_bytes();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(v[7..].trim_ascii());
        }
    }
    headers
        .get("x-api-key")
        .map(|v| v.as_bytes().trim_ascii())
        .filter(|v| !v.is_empty())
}

/// The keys of one snapshot.
#[derive(Debug, Default)]
pub struct KeyTable {
    keys: Vec<ClientKey>,
    by_digest: HashMap<[u8; 32], usize>,
    /// What each user with a budget spent (carried across rebuilds by user).
    user_spend: HashMap<String, Arc<Spend>>,
    user_budgets: Vec<(String, BudgetConfig)>,
}

impl KeyTable {
    /// Build from the config; a key whose state a previous table held keeps it. `models` are
    /// the catalog's model names, in catalog order (each key's globs are matched against them
    /// once, here); `providers` is how many providers the catalog has (a key's `routing` is
    /// compiled into per-provider tables). `env` reads a `key_env` variable. Warnings name keys that cannot be used
    /// (an unset variable) and keys whose globs match no catalog model.
    pub fn build(
        configs: &[ClientKeyConfig],
        user_budgets: &[(String, BudgetConfig)],
        models: &[&str],
        providers: usize,
        previous: Option<&KeyTable>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let mut table = KeyTable {
            user_budgets: user_budgets.to_vec(),
            ..KeyTable::default()
        };
        for (user, _) in user_budgets {
            let spend = previous
                .and_then(|p| p.user_spend.get(user))
                .cloned()
                .unwrap_or_default();
            table.user_spend.insert(user.clone(), spend);
        }
        for (metric, c) in configs.iter().enumerate() {
            let digest = match &c.source {
                ClientKeySource::Sha256(d) => *d,
                ClientKeySource::Env(name) => match env(name).filter(|k| !k.trim().is_empty()) {
                    Some(key) => Sha256::digest(key.trim().as_bytes()).into(),
                    None => {
                        warnings.push(format!(
                            "keys: {:?}: environment variable {name} is not set; the key cannot be used",
                            c.id
                        ));
                        continue;
                    }
                },
            };
            if table.by_digest.contains_key(&digest) {
                warnings.push(format!(
                    "keys: {:?} is the same key as another entry; the first one is used",
                    c.id
                ));
                continue;
            }
            let state = previous
                .and_then(|p| p.by_id(&c.id))
                .map_or_else(Arc::default, |k| k.state.clone());
            let allowed: Option<Vec<Box<str>>> = c
                .allowed_models
                .as_ref()
                .map(|g| g.iter().map(|s| Box::from(s.as_str())).collect());
            let may_use: Option<Arc<[bool]>> = allowed.as_ref().map(|globs| {
                models
                    .iter()
                    .map(|m| {
                        let m = m.to_ascii_lowercase();
                        globs
                            .iter()
                            .any(|g| crate::glob::matches(g.as_bytes(), m.as_bytes()))
                    })
                    .collect()
            });
            if may_use.as_deref().is_some_and(|m| !m.contains(&true)) {
                warnings.push(format!(
                    "keys: {:?}: allowed_models matches no catalog model; every request with it is refused (403)",
                    c.id
                ));
            }
            table.by_digest.insert(digest, table.keys.len());
            table.keys.push(ClientKey {
                id: Arc::from(c.id.as_str()),
                metric,
                user: c.user.as_deref().map(Arc::from),
                digest,
                allowed,
                models: may_use,
                rpm: c.rpm,
                tpm: c.tpm,
                budget: c.budget,
                state,
                user_budget: c.user.as_ref().and_then(|u| {
                    let (_, b) = user_budgets.iter().find(|(name, _)| name == u)?;
                    Some((*b, table.user_spend.get(u)?.clone()))
                }),
                routing: c.routing.as_ref().map(|r| KeyRouting::build(r, providers)),
            });
        }
        (table, warnings)
    }

    /// The key whose digest the presented key has.
    pub fn authenticate(&self, presented: &[u8]) -> Option<(usize, &ClientKey)> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let i = *self.by_digest.get(&digest)?;
        let key = &self.keys[i];
        // The table found it by digest; compared again without an early exit.
        bool::from(key.digest.ct_eq(&digest)).then_some((i, key))
    }

    pub fn get(&self, i: usize) -> Option<&ClientKey> {
        self.keys.get(i)
    }

    /// Every key, in config order.
    pub fn iter(&self) -> impl Iterator<Item = &ClientKey> {
        self.keys.iter()
    }

    /// Every user budget and what that user spent.
    pub fn user_spends(&self) -> impl Iterator<Item = (&str, &BudgetConfig, &Arc<Spend>)> {
        self.user_budgets.iter().filter_map(|(user, budget)| {
            let spend = self.user_spend.get(user)?;
            Some((user.as_str(), budget, spend))
        })
    }

    pub fn by_id(&self, id: &str) -> Option<&ClientKey> {
        self.keys.iter().find(|k| &*k.id == id)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetPeriod;

    fn config(id: &str, key: &str) -> ClientKeyConfig {
        ClientKeyConfig {
            id: id.into(),
            source: ClientKeySource::Sha256(Sha256::digest(key.as_bytes()).into()),
            user: Some("alice".into()),
            allowed_models: Some(vec!["gpt-4o*".into(), "fast".into(), "auto:*".into()]),
            rpm: Some(2),
            tpm: Some(1_000),
            budget: Some(BudgetConfig {
                micro_usd: 500,
                period: BudgetPeriod::Day,
            }),
            routing: None,
        }
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(crate::glob::matches(b"gpt-4o*", b"gpt-4o-mini"));
        assert!(crate::glob::matches(b"gpt-4o*", b"gpt-4o"));
        assert!(!crate::glob::matches(b"gpt-4o*", b"xgpt-4o"));
        assert!(crate::glob::matches(b"auto:*", b"auto:smart"));
        assert!(!crate::glob::matches(b"auto:*", b"auto"));
        assert!(crate::glob::matches(b"*mini", b"gpt-4o-mini"));
        assert!(crate::glob::matches(b"a?c*e", b"abcdde"));
        assert!(!crate::glob::matches(b"fast", b"fastest"));
        assert!(crate::glob::matches(b"*", b""));
    }

    #[test]
    fn a_key_is_found_by_its_digest_and_its_state_survives_a_rebuild() {
        let env = |_: &str| None;
        let models = ["gpt-4o-mini", "claude"];
        let (t, w) = KeyTable::build(&[config("team", "sk-team")], &[], &models, 0, None, &env);
        assert!(w.is_empty());
        let (i, k) = t.authenticate(b"sk-team").expect("found");
        assert_eq!((i, &*k.id), (0, "team"));
        assert!(t.authenticate(b"sk-other").is_none());
        assert!(k.allows("GPT-4o-mini") && k.allows("fast") && !k.allows("claude"));
        // Its globs, matched against the catalog's models once.
        assert!(k.may_use(0) && !k.may_use(1) && !k.may_use(2));
        // A key whose globs match no model is warned about.
        let (_, w) = KeyTable::build(
            &[config("team", "sk-team")],
            &[],
            &["claude"],
            0,
            None,
            &env,
        );
        assert!(w[0].contains("matches no catalog model"), "{w:?}");
        k.admit(100, 10).expect("first");
        let (t2, _) = KeyTable::build(&[config("team", "sk-team")], &[], &[], 0, Some(&t), &env);
        let k2 = t2.by_id("team").expect("kept");
        assert_eq!(k2.state.requests.used(100), 1, "a reload keeps the minute");
    }

    #[test]
    fn limits_refuse_without_consuming_and_settle_with_the_real_counts() {
        let env = |name: &str| (name == "K").then(|| "sk-env".to_string());
        let mut c = config("envkey", "");
        c.source = ClientKeySource::Env("K".into());
        let (t, _) = KeyTable::build(&[c], &[], &[], 0, None, &env);
        let (_, k) = t.authenticate(b"sk-env").expect("from the environment");
        let r = k.admit(1_000, 400).expect("1 of 2");
        k.settle(r, 1_001, Some(100), Some(300), None);
        assert_eq!(
            k.state.tokens.used(1_001),
            100,
            "the estimate corrected down"
        );
        k.admit(1_002, 100).expect("2 of 2");
        assert_eq!(k.admit(1_003, 1), Err(Refusal::RateLimited(57)));
        assert_eq!(
            k.state.requests.used(1_003),
            2,
            "a refusal consumes nothing"
        );
        // Spend: 300 of 500 micro-USD, then 300 more: spent.
        let r = k.admit(1_070, 10).expect("a new minute");
        k.settle(r, 1_071, None, Some(300), None);
        assert!(matches!(k.admit(1_140, 1), Err(Refusal::BudgetExceeded(_))));
        let missing = KeyTable::build(&[config("x", "a")], &[], &[], 0, None, &|_| None).0;
        assert_eq!(missing.len(), 1);
    }

    #[test]
    fn the_presented_key_comes_from_either_header() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer sk-1".parse().expect("v"),
        );
        assert_eq!(presented(&h), Some(&b"sk-1"[..]));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "sk-2".parse().expect("v"));
        assert_eq!(presented(&h), Some(&b"sk-2"[..]));
        assert_eq!(presented(&HeaderMap::new()), None);
    }

    #[test]
    fn cost_is_tokens_times_the_price_per_million() {
        let p = crate::config::Price {
            input_per_mtok: 2.5,
            output_per_mtok: 10.0,
            cached_input_per_mtok: Some(1.25),
        };
        assert_eq!(cost_micro_usd(&p, 1_000, 0, 100), 3_500);
        // 400 of the 1000 prompt tokens came from the cache, at half the input price.
        assert_eq!(cost_micro_usd(&p, 1_000, 400, 100), 3_000);
        let no_cache_price = crate::config::Price {
            cached_input_per_mtok: None,
            ..p
        };
        assert_eq!(cost_micro_usd(&no_cache_price, 1_000, 400, 100), 3_500);
    }
}
