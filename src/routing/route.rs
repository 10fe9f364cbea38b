//! Routes: what a `model` string resolves to (a model, an alias, a chain, an axis, a direct
//! deployment, or one way a policy orders its targets), its candidates cut into segments each
//! ranked on its own, and the [`Builder`] through which the snapshot and the policy compiler
//! both add them.

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use http::HeaderValue;

use crate::catalog::{Catalog, DeploymentIdx};
use crate::config::Strategy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteIdx(pub u32);

impl RouteIdx {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Model,
    Alias,
    Chain,
    Axis,
    Direct,
    /// One way a policy orders its targets.
    Policy,
    /// Requests that ended before a route was resolved (metrics only).
    Unresolved,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Model => "model",
            RouteKind::Alias => "alias",
            RouteKind::Chain => "chain",
            RouteKind::Axis => "axis",
            RouteKind::Direct => "direct",
            RouteKind::Policy => "policy",
            RouteKind::Unresolved => "unresolved",
        }
    }
}

/// One nameable route.
#[derive(Debug)]
pub struct Route {
    pub idx: RouteIdx,
    pub kind: RouteKind,
    pub name: Arc<str>,
    /// `kind:name`: the `x-llm-route` value and the metrics label.
    pub label: Arc<str>,
    pub header: HeaderValue,
    /// Index of `label` among the snapshot's distinct route labels (metrics).
    pub metric: usize,
    /// The strategy of the first segment: what a per-request lead pick follows.
    pub strategy: Strategy,
    /// Deployments to try, in configured order, without duplicates. Empty only for an empty
    /// chain. The ranker's scored order of the same set is in `Rankings`.
    pub candidates: Arc<[DeploymentIdx]>,
    /// Consecutive parts of `candidates`, each ranked on its own by its strategy; together
    /// they cover every candidate.
    pub segments: Arc<[Segment]>,
    /// The route's round-robin turn.
    pub round_robin: AtomicUsize,
    /// Whether planning reads the prompt's token estimate for some candidate
    /// ([`Catalog::reads_tokens`]): when none does, a request's plan is built without one.
    pub reads_tokens: bool,
    /// Whether some candidate compares a request's needs ([`Catalog::reads_needs`]): only then
    /// is the prompt searched for images.
    pub reads_needs: bool,
}

/// A part of a route's candidates ranked on its own.
#[derive(Debug, Clone)]
pub struct Segment {
    pub range: Range<usize>,
    pub strategy: Strategy,
}

impl Route {
    /// How many leading candidates a per-request lead pick may choose among: the first
    /// segment (a policy's selected model, not its fallbacks).
    pub fn lead_span(&self) -> usize {
        self.segments
            .first()
            .map_or(self.candidates.len(), |s| s.range.len())
    }
}

/// Builds the routes of one snapshot (the policy compiler adds its own through it).
pub(super) struct Builder<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) routes: Vec<Route>,
    /// Distinct route labels, in first-use order (the metrics dimension).
    pub(super) labels: Vec<Arc<str>>,
}

impl<'a> Builder<'a> {
    pub(super) fn new(catalog: &'a Catalog) -> Self {
        Self {
            catalog,
            routes: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// A route of one segment.
    pub(super) fn push(
        &mut self,
        kind: RouteKind,
        name: &str,
        strategy: Strategy,
        candidates: Vec<DeploymentIdx>,
    ) -> RouteIdx {
        let segments = vec![Segment {
            range: 0..candidates.len(),
            strategy,
        }];
        self.push_route(kind, name, candidates, segments)
    }

    /// A route made of parts ranked on their own, in order; a deployment already in an
    /// earlier part is left out of later ones (and a part left empty disappears).
    pub(super) fn push_segments(
        &mut self,
        kind: RouteKind,
        name: &str,
        parts: Vec<(Strategy, Vec<DeploymentIdx>)>,
    ) -> RouteIdx {
        let mut candidates: Vec<DeploymentIdx> = Vec::new();
        let mut segments = Vec::with_capacity(parts.len());
        for (strategy, deps) in parts {
            let start = candidates.len();
            for d in self.usable(deps.into_iter()) {
                if !candidates.contains(&d) {
                    candidates.push(d);
                }
            }
            if candidates.len() > start {
                segments.push(Segment {
                    range: start..candidates.len(),
                    strategy,
                });
            }
        }
        self.push_route(kind, name, candidates, segments)
    }

    fn push_route(
        &mut self,
        kind: RouteKind,
        name: &str,
        candidates: Vec<DeploymentIdx>,
        segments: Vec<Segment>,
    ) -> RouteIdx {
        let idx = RouteIdx(u32::try_from(self.routes.len()).unwrap_or(u32::MAX));
        let label: Arc<str> = if kind == RouteKind::Unresolved {
            Arc::from(kind.as_str())
        } else {
            Arc::from(format!("{}:{name}", kind.as_str()))
        };
        let metric = match self.labels.iter().position(|l| *l == label) {
            Some(i) => i,
            None => {
                self.labels.push(label.clone());
                self.labels.len() - 1
            }
        };
        // Names were validated as visible ASCII, so the header value always builds.
        let header =
            HeaderValue::from_str(&label).unwrap_or_else(|_| HeaderValue::from_static("invalid"));
        let strategy = segments.first().map_or(Strategy::Priority, |s| s.strategy);
        let reads = |reads: fn(&Catalog, &crate::catalog::Deployment) -> bool| {
            candidates
                .iter()
                .any(|d| reads(self.catalog, self.catalog.deployment(*d)))
        };
        let (reads_tokens, reads_needs) =
            (reads(Catalog::reads_tokens), reads(Catalog::reads_needs));
        self.routes.push(Route {
            idx,
            kind,
            name: Arc::from(name),
            label,
            header,
            metric,
            strategy,
            candidates: candidates.into(),
            segments: segments.into(),
            round_robin: AtomicUsize::new(0),
            reads_tokens,
            reads_needs,
        });
        idx
    }

    /// Deployments of enabled models, first occurrence only.
    pub(super) fn usable(&self, deps: impl Iterator<Item = DeploymentIdx>) -> Vec<DeploymentIdx> {
        let mut out: Vec<DeploymentIdx> = Vec::new();
        for d in deps {
            let enabled = self
                .catalog
                .deployment(d)
                .model
                .is_some_and(|m| self.catalog.model(m).enabled);
            if !enabled {
                continue;
            }
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::Fixture;

    #[test]
    fn a_route_reads_the_estimate_and_needs_only_when_a_candidate_uses_them() {
        let snapshot = Fixture::new(
            r#"
providers:
  a: { kind: openai, base_url: "http://127.0.0.1:1/v1" }
  b: { kind: openai, base_url: "http://127.0.0.1:2/v1" }
models:
  local: { deployments: [{ provider: a, model: l }] }
  priced: { deployments: [{ provider: a, model: p, price: { input_per_mtok: 1, output_per_mtok: 2 } }] }
  windowed: { context_window: 8000, deployments: [{ provider: a, model: w }] }
  limited: { deployments: [{ provider: a, model: t, tpm: 1000 }] }
  budgeted: { deployments: [{ provider: a, model: u, budget: { usd: 5, period: month } }] }
  spent: { deployments: [{ provider: b, model: s }] }
  capable: { capabilities: [stream, vision], deployments: [{ provider: a, model: c }] }
budgets: { providers: { b: { usd: 5, period: month } } }
chains: { mixed: [local, priced], plain: [local] }
"#,
        )
        .snapshot();
        let reads = |name: &str| {
            let idx = snapshot.by_name(name).expect(name);
            snapshot.route(idx).reads_tokens
        };
        assert!(
            !reads("local"),
            "an unpriced, unbounded model needs no estimate"
        );
        for name in ["priced", "windowed", "limited", "budgeted", "spent"] {
            assert!(reads(name), "{name} reads the estimate");
        }
        let chain = |name: &str| {
            let idx = snapshot.chain(name).expect(name);
            snapshot.route(idx).reads_tokens
        };
        assert!(chain("mixed"), "one priced member is enough");
        assert!(!chain("plain"));
    }
}
