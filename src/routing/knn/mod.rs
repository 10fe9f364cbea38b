//! The knn router's decision (DESIGN §10), as pure functions: a pool of scored examples, the
//! `k` nearest of a request's embedding, each target's predicted quality and utility, and the
//! order the targets are tried in — or why the entry's `default` leads instead.
//!
//! - [`search`]: a pool's examples as one contiguous `f32` matrix of unit vectors (cosine
//!   similarity is then a dot product) and the exact top-k scan; past
//!   [`search::EXACT_LIMIT`] examples an HNSW index ([`ann`]) answers instead.
//! - [`decide`]: the rule. Predicted quality of a target = the similarity-weighted mean of the
//!   neighbours' scores for it (similarities below 0 weigh 0; a target no neighbour scored
//!   predicts 0); utility = quality − `alpha` × its estimated cost ÷ the dearest target's (0
//!   when every target is free); targets ranked by utility, ties in the order written. The
//!   best and second-best utilities within `confidence_floor`: low confidence.
//!
//! Nothing here embeds, stores or counts: `crate::knn` does, and hands the results in.

pub mod ann;
pub mod search;

use std::fmt::Write;
use std::sync::Arc;

pub use search::{Neighbour, Pool, TopK};

/// How a knn entry's order was chosen for one request (the `knn=` of the routing reason and
/// the `outcome` label of `signalbox_knn_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnnOutcome {
    /// Selected, not decided yet (the request path decides before planning).
    Pending,
    /// Ranked by the neighbours.
    Knn,
    /// The pool is colder than `warmup`: the default leads.
    Cold,
    /// The request could not be embedded in time: the default leads.
    EmbedFailed,
    /// The best and second-best targets are within `confidence_floor`: the default leads.
    LowConfidence,
    /// The conversation's earlier decision, reused (`granularity: conversation`).
    Sticky,
}

impl KnnOutcome {
    /// Every outcome a decision can end in, with `router_off` (a `Pick`, not an outcome) last:
    /// the metric's label values.
    pub const LABELS: [&'static str; 6] = [
        "knn",
        "cold",
        "embed_failed",
        "low_confidence",
        "sticky",
        "router_off",
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            KnnOutcome::Pending => "pending",
            KnnOutcome::Knn => "knn",
            KnnOutcome::Cold => "cold",
            KnnOutcome::EmbedFailed => "embed_failed",
            KnnOutcome::LowConfidence => "low_confidence",
            KnnOutcome::Sticky => "sticky",
        }
    }

    /// The index of this outcome in [`KnnOutcome::LABELS`] (`Pending` is never counted).
    pub fn label_index(self) -> usize {
        match self {
            KnnOutcome::Knn | KnnOutcome::Pending => 0,
            KnnOutcome::Cold => 1,
            KnnOutcome::EmbedFailed => 2,
            KnnOutcome::LowConfidence => 3,
            KnnOutcome::Sticky => 4,
        }
    }

    /// A compact code (conversation table values).
    pub fn code(self) -> u64 {
        self.label_index() as u64
    }

    pub fn from_code(code: u64) -> Self {
        match code {
            1 => KnnOutcome::Cold,
            2 => KnnOutcome::EmbedFailed,
            3 => KnnOutcome::LowConfidence,
            4 => KnnOutcome::Sticky,
            _ => KnnOutcome::Knn,
        }
    }
}

/// Which pool answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolUsed {
    /// The caller's user's own pool.
    User,
    /// The shared pool (examples taught without a user) of the request's task.
    Shared,
    /// Neither was warm.
    None,
}

impl PoolUsed {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolUsed::User => "user",
            PoolUsed::Shared => "shared",
            PoolUsed::None => "none",
        }
    }
}

/// The settings a decision reads (`routing_knn`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub k: usize,
    pub alpha: f64,
    pub confidence_floor: f64,
}

/// One target of the entry, as the decision sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The catalog model's name (what examples score).
    pub name: Arc<str>,
    /// This request's estimated cost on it, micro-USD (its cheapest deployment).
    pub cost_micro: u64,
}

/// One target's figures for this request.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Index into the entry's targets (the order written).
    pub target: usize,
    pub quality: f64,
    /// `alpha × cost ÷ dearest cost`.
    pub cost_term: f64,
    pub utility: f64,
}

/// What a decision found: the explain output and the routing reason are made from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub outcome: KnnOutcome,
    pub pool: PoolUsed,
    /// Examples in the pool used (or in the warmest pool looked at, when cold).
    pub examples: usize,
    /// The neighbours' similarities, nearest first.
    pub neighbours: Vec<f32>,
    /// Every target ranked by utility (empty unless the neighbours were consulted).
    pub scored: Vec<Scored>,
    /// The order tried: indices into the entry's targets (empty: the default leads).
    pub order: Vec<usize>,
}

/// Rank `targets` by the neighbours found in `pool`. `neighbours` are (similarity, example)
/// nearest first.
pub fn score(
    pool: &Pool,
    neighbours: &[Neighbour],
    targets: &[Candidate],
    alpha: f64,
) -> Vec<Scored> {
    let dearest = targets.iter().map(|t| t.cost_micro).max().unwrap_or(0);
    let mut scored: Vec<Scored> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = pool.name_index(&t.name);
            let (mut weighted, mut weights) = (0.0f64, 0.0f64);
            for n in neighbours {
                let Some(s) = name.and_then(|name| pool.score(n.example, name)) else {
                    continue;
                };
                let w = f64::from(n.similarity.max(0.0));
                weighted += w * f64::from(s);
                weights += w;
            }
            let quality = if weights > 0.0 {
                weighted / weights
            } else {
                0.0
            };
            #[allow(clippy::cast_precision_loss)]
            let cost_term = if dearest == 0 {
                0.0
            } else {
                alpha * t.cost_micro as f64 / dearest as f64
            };
            Scored {
                target: i,
                quality,
                cost_term,
                utility: quality - cost_term,
            }
        })
        .collect();
    // Highest utility first; ties keep the order written (a stable sort).
    scored.sort_by(|a, b| b.utility.total_cmp(&a.utility));
    scored
}

/// The decision for a request whose pool is `pool` (`None`: none is warm) and whose
/// embedding is `query` (`None`: it failed or timed out).
pub fn decide(
    rule: Rule,
    pool: Option<(&Pool, PoolUsed)>,
    examples_seen: usize,
    query: Option<&[f32]>,
    targets: &[Candidate],
    top: &mut TopK,
) -> Report {
    let mut report = Report {
        outcome: KnnOutcome::Cold,
        pool: PoolUsed::None,
        examples: examples_seen,
        neighbours: Vec::new(),
        scored: Vec::new(),
        order: Vec::new(),
    };
    let Some((pool, used)) = pool else {
        return report;
    };
    report.pool = used;
    report.examples = pool.len();
    let Some(query) = query.filter(|q| q.len() == pool.dims()) else {
        // No vector, or one of another dimension than the pool's (the embedding model changed).
        report.outcome = KnnOutcome::EmbedFailed;
        return report;
    };
    pool.nearest(query, rule.k, top);
    let neighbours = top.sorted();
    report.neighbours = neighbours.iter().map(|n| n.similarity).collect();
    report.scored = score(pool, neighbours, targets, rule.alpha);
    let confident = match report.scored.as_slice() {
        [best, second, ..] => best.utility - second.utility > rule.confidence_floor,
        _ => true,
    };
    if confident {
        report.outcome = KnnOutcome::Knn;
        report.order = report.scored.iter().map(|s| s.target).collect();
    } else {
        report.outcome = KnnOutcome::LowConfidence;
    }
    report
}

impl Report {
    /// The routing reason's knn part: `knn=<outcome> pool=<user|shared|none> nn=<sims>` and,
    /// when the neighbours were consulted, `<target>:q=<quality>,c=<cost term>,u=<utility>`
    /// per target, best first (bounded by the header buffer it is written into).
    pub fn reason(&self, names: &[Arc<str>]) -> String {
        let mut out = String::with_capacity(160);
        let _ = write!(
            out,
            "knn={} pool={}",
            self.outcome.as_str(),
            self.pool.as_str()
        );
        if !self.neighbours.is_empty() {
            out.push_str(" nn=");
            for (i, s) in self.neighbours.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{s:.2}");
            }
        }
        for s in &self.scored {
            let name = names.get(s.target).map_or("?", |n| n);
            let _ = write!(
                out,
                " {name}:q={:.2},c={:.2},u={:.2}",
                s.quality, s.cost_term, s.utility
            );
        }
        out
    }

    /// The explain output's `knn` object.
    pub fn json(&self, names: &[Arc<str>]) -> serde_json::Value {
        serde_json::json!({
            "outcome": self.outcome.as_str(),
            "pool": self.pool.as_str(),
            "examples": self.examples,
            "neighbours": self.neighbours.iter().map(|s| serde_json::json!({"similarity": s})).collect::<Vec<_>>(),
            "targets": self.scored.iter().map(|s| serde_json::json!({
                "model": names.get(s.target).map(|n| &**n),
                "predicted_quality": s.quality,
                "cost_term": s.cost_term,
                "utility": s.utility,
            })).collect::<Vec<_>>(),
            "order": self.order.iter().filter_map(|&t| names.get(t).map(|n| &**n)).collect::<Vec<_>>(),
        })
    }
}

// === Orders as route indices ===

/// `n!`.
pub fn factorial(n: usize) -> usize {
    (1..=n).product()
}

/// The permutation of `0..n` with lexicographic rank `index` (the inverse of [`rank`]).
pub fn unrank(mut index: usize, n: usize) -> Vec<usize> {
    let mut left: Vec<usize> = (0..n).collect();
    let mut out = Vec::with_capacity(n);
    for i in (0..n).rev() {
        let f = factorial(i);
        let pick = (index / f).min(left.len().saturating_sub(1));
        index %= f.max(1);
        out.push(left.remove(pick));
    }
    out
}

/// The lexicographic rank of a permutation of `0..n` (its route among a knn entry's orders).
pub fn rank(order: &[usize]) -> usize {
    let n = order.len();
    let mut index = 0;
    for (i, &v) in order.iter().enumerate() {
        let smaller_after = order[i + 1..].iter().filter(|&&w| w < v).count();
        index += smaller_after * factorial(n - 1 - i);
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    type Example<'a> = (&'a [f32], &'a [(&'a str, f32)]);

    fn pool(examples: &[Example<'_>]) -> Pool {
        let mut p = Pool::new(examples[0].0.len());
        for (v, scores) in examples {
            let scores: Vec<(Arc<str>, f32)> =
                scores.iter().map(|(n, s)| (Arc::from(*n), *s)).collect();
            p.push(v, &scores, 0);
        }
        p
    }

    fn candidates(costs: &[(&str, u64)]) -> Vec<Candidate> {
        costs
            .iter()
            .map(|(n, c)| Candidate {
                name: Arc::from(*n),
                cost_micro: *c,
            })
            .collect()
    }

    #[test]
    fn orders_and_route_indices_are_inverse() {
        for n in 1..=5 {
            let mut seen = std::collections::HashSet::new();
            for i in 0..factorial(n) {
                let p = unrank(i, n);
                assert_eq!(rank(&p), i, "{p:?}");
                assert!(seen.insert(p));
            }
        }
        assert_eq!(unrank(0, 3), [0, 1, 2]);
        assert_eq!(unrank(5, 3), [2, 1, 0]);
    }

    #[test]
    fn quality_is_the_similarity_weighted_mean_and_cost_is_relative_to_the_dearest() {
        let p = pool(&[
            (&[1.0, 0.0], &[("a", 1.0), ("b", 0.0)]),
            (&[0.0, 1.0], &[("a", 0.0), ("b", 1.0)]),
        ]);
        // Similarities 0.8 and 0.6 (after normalising the query to (0.8, 0.6)).
        let neighbours = [
            Neighbour {
                similarity: 0.8,
                example: 0,
            },
            Neighbour {
                similarity: 0.6,
                example: 1,
            },
        ];
        let s = score(&p, &neighbours, &candidates(&[("a", 100), ("b", 50)]), 0.5);
        let a = s.iter().find(|s| s.target == 0).unwrap();
        let b = s.iter().find(|s| s.target == 1).unwrap();
        assert!((a.quality - 0.8 / 1.4).abs() < 1e-6);
        assert!((b.quality - 0.6 / 1.4).abs() < 1e-6);
        assert!((a.cost_term - 0.5).abs() < 1e-6);
        assert!((b.cost_term - 0.25).abs() < 1e-6);
        // a: 0.571 - 0.5 = 0.071; b: 0.429 - 0.25 = 0.179: the cheaper one wins.
        assert_eq!(s[0].target, 1);
        // Everything free: quality alone.
        let s = score(&p, &neighbours, &candidates(&[("a", 0), ("b", 0)]), 0.5);
        assert_eq!(s[0].target, 0);
        assert_eq!(s[0].cost_term, 0.0);
    }

    #[test]
    fn unscored_targets_predict_zero_and_negative_similarities_weigh_nothing() {
        let p = pool(&[(&[1.0, 0.0], &[("a", 0.9)]), (&[-1.0, 0.0], &[("a", 0.1)])]);
        let neighbours = [
            Neighbour {
                similarity: 1.0,
                example: 0,
            },
            Neighbour {
                similarity: -1.0,
                example: 1,
            },
        ];
        let s = score(&p, &neighbours, &candidates(&[("a", 0), ("b", 0)]), 0.5);
        assert!((s[0].quality - 0.9).abs() < 1e-6);
        assert_eq!(s[1].quality, 0.0);
    }

    #[test]
    fn the_default_leads_when_cold_unembedded_or_unsure() {
        let rule = Rule {
            k: 2,
            alpha: 0.0,
            confidence_floor: 0.1,
        };
        let targets = candidates(&[("a", 0), ("b", 0)]);
        let mut top = TopK::new();
        let cold = decide(rule, None, 3, Some(&[1.0, 0.0]), &targets, &mut top);
        assert_eq!((cold.outcome, cold.examples), (KnnOutcome::Cold, 3));
        let p = pool(&[
            (&[1.0, 0.0], &[("a", 0.9), ("b", 0.2)]),
            (&[0.9, 0.1], &[("a", 0.8), ("b", 0.1)]),
        ]);
        let used = Some((&p, PoolUsed::Shared));
        let failed = decide(rule, used, 0, None, &targets, &mut top);
        assert_eq!(failed.outcome, KnnOutcome::EmbedFailed);
        let other_dims = decide(rule, used, 0, Some(&[1.0, 0.0, 0.0]), &targets, &mut top);
        assert_eq!(other_dims.outcome, KnnOutcome::EmbedFailed);
        let sure = decide(rule, used, 0, Some(&[1.0, 0.0]), &targets, &mut top);
        assert_eq!(sure.outcome, KnnOutcome::Knn);
        assert_eq!(sure.order, [0, 1]);
        assert_eq!(sure.neighbours.len(), 2);
        let unsure = decide(
            Rule {
                confidence_floor: 0.9,
                ..rule
            },
            used,
            0,
            Some(&[1.0, 0.0]),
            &targets,
            &mut top,
        );
        assert_eq!(unsure.outcome, KnnOutcome::LowConfidence);
        assert!(unsure.order.is_empty());
        let names: Vec<Arc<str>> = vec![Arc::from("a"), Arc::from("b")];
        let reason = sure.reason(&names);
        assert!(
            reason.starts_with("knn=knn pool=shared nn=1.00,"),
            "{reason}"
        );
        assert!(reason.contains(" a:q=0.85,c=0.00,u=0.85"), "{reason}");
    }
}
