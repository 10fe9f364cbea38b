//! The approximate index of a pool past [`super::search::EXACT_LIMIT`] examples: an HNSW graph
//! from the `instant-distance` crate (pure Rust, maintained), over cosine distance
//! (`1 − dot` of unit vectors).
//!
//! The graph holds its own copy of the pool's matrix (one `Arc<[f32]>`; each point is a row
//! of it), so a pool past the limit takes twice its vectors' memory. It is built whole when
//! the pool changes (examples taught or dropped), on a blocking thread, never on the request
//! path; a search allocates only the query's copy. `ef_search` and `ef_construction` are set
//! for recall ≥ 0.95 at k = 5 (measured by `benches/knn.rs`, which prints it).

use std::sync::Arc;

use instant_distance::{Builder, HnswMap, Point, Search};

use super::search::{dot, Pool};

/// The beam of a search (instant-distance's `ef`), and of the build.
pub const EF_SEARCH: usize = 128;
pub const EF_CONSTRUCTION: usize = 200;
/// The build's seed: the same pool builds the same graph.
const SEED: u64 = 0x6b6e_6e5f_616e_6e00;

/// A row of a matrix, as a point of the graph.
#[derive(Clone)]
struct Row {
    data: Arc<[f32]>,
    start: usize,
    dims: usize,
}

impl Row {
    fn slice(&self) -> &[f32] {
        &self.data[self.start..self.start + self.dims]
    }
}

impl Point for Row {
    fn distance(&self, other: &Self) -> f32 {
        1.0 - dot(self.slice(), other.slice())
    }
}

/// The HNSW graph of one pool; values are the pool's row numbers.
pub struct AnnIndex {
    map: HnswMap<Row, usize>,
}

impl std::fmt::Debug for AnnIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnnIndex")
            .field("points", &self.map.values.len())
            .finish()
    }
}

impl AnnIndex {
    /// Index every row of `pool` (slow: seconds for tens of thousands of rows).
    pub fn build(pool: &Pool) -> Self {
        let dims = pool.dims();
        let mut data = Vec::with_capacity(pool.len() * dims);
        for i in 0..pool.len() {
            data.extend_from_slice(pool.vector(i));
        }
        let data: Arc<[f32]> = data.into();
        let points: Vec<Row> = (0..pool.len())
            .map(|i| Row {
                data: data.clone(),
                start: i * dims,
                dims,
            })
            .collect();
        let values: Vec<usize> = (0..pool.len()).collect();
        let map = Builder::default()
            .ef_search(EF_SEARCH)
            .ef_construction(EF_CONSTRUCTION)
            .seed(SEED)
            .build(points, values);
        Self { map }
    }

    /// The rows of (about) the `k` nearest to `query` (a unit vector), nearest first.
    pub fn search(&self, query: &[f32], k: usize) -> Vec<usize> {
        let unit = super::search::normalised(query).unwrap_or_else(|| query.to_vec());
        let dims = unit.len();
        let q = Row {
            data: unit.into(),
            start: 0,
            dims,
        };
        let mut search = Search::default();
        self.map
            .search(&q, &mut search)
            .take(k)
            .map(|item| *item.value)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_exact_neighbours_of_clustered_rows_nearly_always() {
        let dims = 32;
        let mut pool = Pool::new(dims);
        let mut x = 11u64;
        let mut next = || {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let centres: Vec<Vec<f32>> = (0..20)
            .map(|_| (0..dims).map(|_| next()).collect())
            .collect();
        for i in 0..3000 {
            let c = &centres[i % centres.len()];
            let v: Vec<f32> = c.iter().map(|x| x + 0.3 * next()).collect();
            pool.push(&v, &[], 0);
        }
        let index = AnnIndex::build(&pool);
        let mut top = super::super::TopK::new();
        let (mut hit, mut total) = (0, 0);
        for q in 0..50 {
            let c = &centres[q % centres.len()];
            let v: Vec<f32> = c.iter().map(|x| x + 0.3 * next()).collect();
            top.reset(5);
            pool.scan(&v, 1.0 / dot(&v, &v).sqrt(), &mut top);
            let exact: Vec<usize> = top.sorted().iter().map(|n| n.example).collect();
            let approx = index.search(&v, 5);
            hit += exact.iter().filter(|e| approx.contains(e)).count();
            total += exact.len();
        }
        #[allow(clippy::cast_precision_loss)]
        let recall = hit as f64 / total as f64;
        assert!(recall >= 0.95, "recall {recall}");
    }
}
