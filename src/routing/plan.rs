//! A request's plan: the route's candidates walked one target at a time.
//!
//! A candidate is a deployment; a target is a deployment with one credential chosen. The
//! credential is a separate, later decision (seed `000`): round-robin across a provider's
//! usable keys, and after a credential-scoped failure (401/403/429) the same deployment is
//! tried again with its next key before the plan moves on. Every other failure moves to the
//! next deployment. A target is never tried twice in one request; a candidate that cannot be
//! called (provider disabled, no usable key, host not resolved, excluded by the request's
//! `routing.providers`) is skipped without an upstream call and its reason is kept.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::catalog::{Catalog, Deployment, DeploymentIdx, ProviderIdx};

/// Why a candidate was passed over without a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    ProviderDisabled,
    NoCredential,
    Unresolved,
    Excluded,
}

/// One attempt's destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Position of the deployment in the plan.
    pub position: usize,
    pub credential: usize,
}

/// Where the plan should look next after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Another credential of the same deployment, then the next deployment.
    NextCredential,
    /// The next deployment.
    NextDeployment,
}

#[derive(Debug, Clone)]
enum Candidates {
    Shared(Arc<[DeploymentIdx]>),
    Adhoc(Arc<Deployment>),
}

/// Per-request walk over a route's candidates.
#[derive(Debug, Clone)]
pub struct Plan {
    candidates: Candidates,
    /// Providers the request allowed (`routing.providers`); `None` = all.
    allowed: Option<Vec<ProviderIdx>>,
    /// Position of the current candidate; `None` before the first pick.
    pos: Option<usize>,
    /// Credentials already tried on the current candidate (bit i = credential i).
    tried_credentials: u64,
    skipped: [u16; 4],
}

impl Plan {
    pub fn new(candidates: Arc<[DeploymentIdx]>) -> Self {
        Self::with(Candidates::Shared(candidates))
    }

    pub fn adhoc(deployment: Arc<Deployment>) -> Self {
        Self::with(Candidates::Adhoc(deployment))
    }

    fn with(candidates: Candidates) -> Self {
        Self {
            candidates,
            allowed: None,
            pos: None,
            tried_credentials: 0,
            skipped: [0; 4],
        }
    }

    /// Restrict the plan to these providers (the request's `routing.providers`).
    pub fn restrict_to(&mut self, providers: Vec<ProviderIdx>) {
        self.allowed = Some(providers);
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

    /// How many candidates were skipped for a reason.
    pub fn skipped(&self, reason: SkipReason) -> u16 {
        self.skipped[reason as usize]
    }

    /// The next target to call, or `None` when the plan is exhausted.
    pub fn next(&mut self, catalog: &Catalog, advance: Advance) -> Option<Target> {
        if let (Some(pos), Advance::NextCredential) = (self.pos, advance) {
            if let Some(t) = self.pick_credential(catalog, pos) {
                return Some(t);
            }
        }
        let mut pos = self.pos.map_or(0, |p| p + 1);
        while pos < self.len() {
            self.pos = Some(pos);
            self.tried_credentials = 0;
            match self.viable(catalog, pos) {
                Ok(()) => {
                    if let Some(t) = self.pick_credential(catalog, pos) {
                        return Some(t);
                    }
                    self.skipped[SkipReason::NoCredential as usize] += 1;
                }
                Err(reason) => self.skipped[reason as usize] += 1,
            }
            pos += 1;
        }
        self.pos = Some(self.len());
        None
    }

    fn viable(&self, catalog: &Catalog, pos: usize) -> Result<(), SkipReason> {
        let Some(d) = self.deployment(catalog, pos) else {
            return Err(SkipReason::Excluded);
        };
        let p = catalog.provider(d.provider);
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(&d.provider) {
                return Err(SkipReason::Excluded);
            }
        }
        if !p.enabled {
            return Err(SkipReason::ProviderDisabled);
        }
        if p.addrs.snapshot().is_empty() {
            return Err(SkipReason::Unresolved);
        }
        Ok(())
    }

    /// Choose an untried usable credential of the deployment at `pos`, starting from the
    /// provider's round-robin cursor.
    fn pick_credential(&mut self, catalog: &Catalog, pos: usize) -> Option<Target> {
        let d = self.deployment(catalog, pos)?;
        let p = catalog.provider(d.provider);
        let n = p.credentials.len().min(64);
        if n == 0 {
            return None;
        }
        let start = if self.tried_credentials == 0 {
            p.credential_cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        for k in 0..n {
            let i = (start + k) % n;
            if self.tried_credentials & (1 << i) != 0 || !p.credentials[i].usable {
                continue;
            }
            self.tried_credentials |= 1 << i;
            return Some(Target {
                position: pos,
                credential: i,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::tests::{tables_from, CONFIG};
    use crate::routing::{resolve, Resolution};

    fn plan(t: &crate::routing::Tables, model: &str) -> Plan {
        match resolve(t, model).expect("resolves") {
            Resolution::Route(r) => Plan::new(t.route(r).candidates.clone()),
            Resolution::Adhoc { deployment, .. } => Plan::adhoc(deployment),
        }
    }

    fn via(t: &crate::routing::Tables, p: &Plan, target: Target) -> String {
        let d = p
            .deployment(&t.catalog, target.position)
            .expect("deployment");
        let cred = &t.catalog.provider(d.provider).credentials[target.credential].id;
        format!("{}#{cred}", d.routed_via.to_str().unwrap_or(""))
    }

    #[test]
    fn walks_candidates_and_credentials() {
        let t = tables_from(CONFIG);
        let mut p = plan(&t, "auto");
        let first = p.next(&t.catalog, Advance::NextDeployment).expect("first");
        assert_eq!(via(&t, &p, first), "b/llama-8b#none");
        // A credential-scoped failure on a single-key provider moves on.
        let second = p.next(&t.catalog, Advance::NextCredential).expect("second");
        assert!(via(&t, &p, second).starts_with("a/gpt-4o-mini#"));
        // Provider a has two keys: a credential failure tries the other one.
        let third = p.next(&t.catalog, Advance::NextCredential).expect("third");
        assert_eq!(third.position, second.position);
        assert_ne!(third.credential, second.credential);
        // Both keys used: the next credential failure moves to the next deployment.
        let fourth = p.next(&t.catalog, Advance::NextCredential).expect("fourth");
        assert!(via(&t, &p, fourth).starts_with("a/big-1#"));
        // c is disabled: skipped without a call, then the plan ends.
        assert_eq!(p.next(&t.catalog, Advance::NextDeployment), None);
        assert_eq!(p.skipped(SkipReason::ProviderDisabled), 1);
        assert_eq!(p.next(&t.catalog, Advance::NextDeployment), None);
    }

    #[test]
    fn credentials_rotate_across_requests() {
        let t = tables_from(CONFIG);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let mut p = plan(&t, "a/gpt-4o-mini");
            let target = p.next(&t.catalog, Advance::NextDeployment).expect("target");
            seen.insert(target.credential);
        }
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn request_restriction_excludes_providers() {
        let t = tables_from(CONFIG);
        let mut p = plan(&t, "fast");
        let a = t.catalog.provider_by_id("a").expect("a").idx;
        p.restrict_to(vec![a]);
        let first = p.next(&t.catalog, Advance::NextDeployment).expect("first");
        assert!(via(&t, &p, first).starts_with("a/"));
        assert_eq!(p.skipped(SkipReason::Excluded), 1);
    }

    #[test]
    fn unusable_credentials_are_skipped() {
        let config = crate::config::parse(
            r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1", credentials: [{ id: k, key_env: UNSET_FOR_TEST }] }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  m: { deployments: [{ provider: a, model: x }, { provider: b, model: y, priority: 20 }] }
"#,
        )
        .expect("valid");
        let resolve_addr = |_: &str, p: u16| vec![std::net::SocketAddr::from(([127, 0, 0, 1], p))];
        let read = |s: &crate::config::KeySource| match s {
            crate::config::KeySource::Env(_) => Err("unset".to_string()),
            _ => Ok(None),
        };
        let (cat, _) = Catalog::build(&config, &resolve_addr, &read).expect("catalog");
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let t = crate::routing::Tables::build(&config, Arc::new(cat), &metrics, 1);
        let mut p = plan(&t, "m");
        let first = p
            .next(&t.catalog, Advance::NextDeployment)
            .expect("b serves");
        assert_eq!(via(&t, &p, first), "b/y#none");
        assert_eq!(p.skipped(SkipReason::NoCredential), 1);
    }
}
