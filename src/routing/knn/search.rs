//! A pool of scored examples and its nearest-neighbour search.
//!
//! Vectors are L2-normalised when they enter, so cosine similarity is a dot product, and they
//! are stored back to back in one `Vec<f32>` (row `i` is `vectors[i*d..(i+1)*d]`): the exact
//! scan walks memory once, front to back, and the dot product's fixed-width inner loop
//! (eight independent accumulators) is auto-vectorised. The `k` best are kept in a small
//! sorted buffer ([`TopK`], reused across calls: no allocation per search once warm): for
//! `k` ≤ 100 an insertion into a sorted array beats a binary heap, and most rows are rejected
//! by one compare against the current k-th.
//!
//! Up to [`EXACT_LIMIT`] examples the scan is exact. A pool past that is also indexed by an
//! HNSW graph ([`super::ann`], built when the pool changes, off the request path), which
//! answers instead; its candidates' similarities are then recomputed exactly.

use std::sync::Arc;

use super::ann::AnnIndex;

/// The most examples a pool is scanned exactly; past it the ANN index answers.
pub const EXACT_LIMIT: usize = 10_000;

/// One neighbour: its cosine similarity to the query and its row in the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    pub similarity: f32,
    pub example: usize,
}

/// The `k` best neighbours found so far, best first.
#[derive(Debug, Default)]
pub struct TopK {
    k: usize,
    best: Vec<Neighbour>,
}

impl TopK {
    pub fn new() -> Self {
        Self::default()
    }

    /// Start a search for `k` neighbours (keeps the buffer).
    pub fn reset(&mut self, k: usize) {
        self.k = k;
        self.best.clear();
        self.best.reserve(k + 1);
    }

    /// Offer a row; kept when it is among the `k` best so far.
    #[inline]
    pub fn offer(&mut self, similarity: f32, example: usize) {
        if self.best.len() == self.k {
            match self.best.last() {
                Some(worst) if similarity > worst.similarity => {}
                _ => return,
            }
            self.best.pop();
        }
        let at = self.best.partition_point(|n| n.similarity >= similarity);
        self.best.insert(
            at,
            Neighbour {
                similarity,
                example,
            },
        );
    }

    /// The neighbours found, nearest first.
    pub fn sorted(&self) -> &[Neighbour] {
        &self.best
    }
}

/// `a · b` over equal-length slices.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 8..a.len().min(b.len()) {
        sum += a[i] * b[i];
    }
    sum
}

/// `v` scaled to unit length; `None` for a zero (or non-finite) vector.
pub fn normalised(v: &[f32]) -> Option<Vec<f32>> {
    let norm = dot(v, v).sqrt();
    (norm.is_finite() && norm > 0.0).then(|| v.iter().map(|x| x / norm).collect())
}

/// One pool's examples: unit vectors, their scores by target name, and when each was taught.
#[derive(Debug, Clone)]
pub struct Pool {
    dims: usize,
    vectors: Vec<f32>,
    /// Per example: (index into `names`, score 0..=1).
    scores: Vec<Box<[(u16, f32)]>>,
    /// Per example: its id in the store (insertion order; 0 when not stored).
    ids: Vec<i64>,
    names: Vec<Arc<str>>,
    ann: Option<Arc<AnnIndex>>,
}

impl Pool {
    pub fn new(dims: usize) -> Self {
        Self {
            dims,
            vectors: Vec::new(),
            scores: Vec::new(),
            ids: Vec::new(),
            names: Vec::new(),
            ann: None,
        }
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn len(&self) -> usize {
        self.scores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// The store ids, oldest first.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// Row `i`'s unit vector.
    pub fn vector(&self, i: usize) -> &[f32] {
        &self.vectors[i * self.dims..(i + 1) * self.dims]
    }

    pub fn name_index(&self, name: &str) -> Option<u16> {
        self.names
            .iter()
            .position(|n| &**n == name)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// Example `i`'s score for target name `name` (an index from [`Pool::name_index`]).
    pub fn score(&self, i: usize, name: u16) -> Option<f32> {
        self.scores
            .get(i)?
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }

    /// Add an example (its vector normalised here). `false`: a vector of another dimension,
    /// or a zero vector; nothing added.
    pub fn push(&mut self, vector: &[f32], scores: &[(Arc<str>, f32)], id: i64) -> bool {
        if vector.len() != self.dims {
            return false;
        }
        let Some(unit) = normalised(vector) else {
            return false;
        };
        let scores: Box<[(u16, f32)]> = scores
            .iter()
            .filter_map(|(name, s)| {
                let i = match self.name_index(name) {
                    Some(i) => i,
                    None => {
                        self.names.push(name.clone());
                        u16::try_from(self.names.len() - 1).ok()?
                    }
                };
                Some((i, *s))
            })
            .collect();
        self.vectors.extend_from_slice(&unit);
        self.scores.push(scores);
        self.ids.push(id);
        self.ann = None;
        true
    }

    /// Drop the oldest examples beyond `max`; returns how many went.
    pub fn truncate_oldest(&mut self, max: usize) -> usize {
        let excess = self.len().saturating_sub(max);
        if excess > 0 {
            self.vectors.drain(..excess * self.dims);
            self.scores.drain(..excess);
            self.ids.drain(..excess);
            self.ann = None;
        }
        excess
    }

    /// Build the ANN index when the pool is past the exact limit (slow: off the request path).
    pub fn index(&mut self) {
        if self.len() > EXACT_LIMIT && self.ann.is_none() {
            self.ann = Some(Arc::new(AnnIndex::build(self)));
        }
    }

    /// Whether the ANN index answers this pool's searches.
    pub fn indexed(&self) -> bool {
        self.ann.is_some()
    }

    /// The `k` nearest examples to `query` (a vector of this pool's dimension; normalised
    /// here when it is not already), into `top`.
    pub fn nearest(&self, query: &[f32], k: usize, top: &mut TopK) {
        top.reset(k);
        if query.len() != self.dims || k == 0 {
            return;
        }
        let norm = dot(query, query).sqrt();
        let scale = if norm > 0.0 && norm.is_finite() {
            1.0 / norm
        } else {
            return;
        };
        match &self.ann {
            Some(ann) => {
                for example in ann.search(query, k) {
                    top.offer(dot(query, self.vector(example)) * scale, example);
                }
            }
            None => self.scan(query, scale, top),
        }
    }

    /// The exact scan over every row.
    pub fn scan(&self, query: &[f32], scale: f32, top: &mut TopK) {
        for (i, row) in self.vectors.chunks_exact(self.dims).enumerate() {
            top.offer(dot(query, row) * scale, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute(pool: &Pool, q: &[f32], k: usize) -> Vec<usize> {
        let unit = normalised(q).unwrap();
        let mut all: Vec<(f32, usize)> = (0..pool.len())
            .map(|i| {
                let s: f32 = unit.iter().zip(pool.vector(i)).map(|(a, b)| a * b).sum();
                (s, i)
            })
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        all.into_iter().take(k).map(|(_, i)| i).collect()
    }

    #[test]
    fn the_top_k_is_the_brute_force_answer() {
        let dims = 13;
        let mut pool = Pool::new(dims);
        let mut x = 7u64;
        let mut next = || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        for _ in 0..500 {
            let v: Vec<f32> = (0..dims).map(|_| next()).collect();
            assert!(pool.push(&v, &[], 0));
        }
        let mut top = TopK::new();
        for _ in 0..20 {
            let q: Vec<f32> = (0..dims).map(|_| next()).collect();
            pool.nearest(&q, 5, &mut top);
            let got: Vec<usize> = top.sorted().iter().map(|n| n.example).collect();
            assert_eq!(got, brute(&pool, &q, 5));
        }
    }

    #[test]
    fn oldest_examples_go_first_and_bad_vectors_are_refused() {
        let mut pool = Pool::new(2);
        assert!(!pool.push(&[1.0, 0.0, 0.0], &[], 1));
        assert!(!pool.push(&[0.0, 0.0], &[], 1));
        for id in 1..=4 {
            #[allow(clippy::cast_precision_loss)]
            let v = [id as f32, 1.0];
            assert!(pool.push(&v, &[(Arc::from("a"), 0.5)], id));
        }
        assert_eq!(pool.truncate_oldest(3), 1);
        assert_eq!(pool.ids(), [2, 3, 4]);
        assert_eq!(pool.score(0, 0), Some(0.5));
        let unit = pool.vector(0);
        assert!((unit[0] * unit[0] + unit[1] * unit[1] - 1.0).abs() < 1e-6);
    }

    proptest! {
        #[test]
        fn scan_agrees_with_brute_force(
            rows in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 6), 1..60),
            q in proptest::collection::vec(-1.0f32..1.0, 6),
            k in 1usize..8,
        ) {
            let mut pool = Pool::new(6);
            for r in &rows {
                pool.push(r, &[], 0);
            }
            prop_assume!(normalised(&q).is_some());
            let mut top = TopK::new();
            pool.nearest(&q, k, &mut top);
            let got: Vec<f32> = top.sorted().iter().map(|n| n.similarity).collect();
            let unit = normalised(&q).unwrap();
            let mut want: Vec<f32> = (0..pool.len())
                .map(|i| unit.iter().zip(pool.vector(i)).map(|(a, b)| a * b).sum())
                .collect();
            want.sort_by(|a, b| b.total_cmp(a));
            want.truncate(k);
            prop_assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                prop_assert!((g - w).abs() < 1e-4, "{:?} vs {:?}", got, want);
            }
        }
    }
}
