//! What the knn router remembers across requests and reloads (on [`crate::snapshot::Runtime`]):
//! the pools of scored examples, the conversations' decisions, and the store they are kept in.
//!
//! - **Pools** are one immutable map behind an `ArcSwap`: a request does one `load()` and one
//!   hash lookup (by a 64-bit hash of (policy, user, task), the key compared on a hit: no
//!   allocation). Teaching and forgetting are admin writes: serialised by an async mutex (off
//!   the request path), they copy the map and the changed pool, then swap. A pool of 10,000
//!   examples × 1,536 dimensions is 60 MiB, so a write to it costs a copy of that: writes are
//!   batches of examples, rare next to requests.
//! - **Conversations** (`granularity: conversation`): a fixed-size, direct-mapped table of
//!   atomics like the sticky sessions (`routing::session`): lock-free, bounded, an hour's ttl.
//!   Two conversations hashing to one slot evict each other (the later one decides again);
//!   a read racing a write may, for that one request, take the other's order. Both are
//!   acceptable: a conversation's decision is an affinity, and every order is one of the
//!   entry's own. The tag mixes in the snapshot generation and the policy entry, so a reload
//!   decides again. Time is the health clock's (injectable in tests).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use super::store::ExampleStore;
use crate::catalog::stable_hash;
use crate::routing::knn::{KnnOutcome, Pool};

/// One example to teach: its embedding and its scores by target name.
pub type Taught = (Vec<f32>, Vec<(Arc<str>, f32)>);

/// Which pool: the policy, the key's user (`None`: the shared pool) and the task.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolKey {
    pub policy: String,
    pub user: Option<String>,
    pub task: Option<String>,
}

impl PoolKey {
    fn hash_of(policy: &str, user: Option<&str>, task: Option<&str>) -> u64 {
        let mut bytes = Vec::with_capacity(policy.len() + 64);
        for part in [Some(policy), user, task] {
            match part {
                Some(p) => {
                    bytes.push(1);
                    bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
                    bytes.extend_from_slice(p.as_bytes());
                }
                None => bytes.push(0),
            }
        }
        stable_hash(&bytes)
    }

    fn hash(&self) -> u64 {
        Self::hash_of(&self.policy, self.user.as_deref(), self.task.as_deref())
    }

    fn is(&self, policy: &str, user: Option<&str>, task: Option<&str>) -> bool {
        self.policy == policy && self.user.as_deref() == user && self.task.as_deref() == task
    }
}

/// The pools, by key hash.
#[derive(Debug, Default, Clone)]
pub struct Pools {
    map: HashMap<u64, (PoolKey, Arc<Pool>)>,
}

impl Pools {
    pub fn get(&self, policy: &str, user: Option<&str>, task: Option<&str>) -> Option<&Arc<Pool>> {
        let h = PoolKey::hash_of(policy, user, task);
        self.map
            .get(&h)
            .filter(|(k, _)| k.is(policy, user, task))
            .map(|(_, p)| p)
    }

    /// Every pool, in key order.
    pub fn list(&self) -> Vec<(&PoolKey, &Arc<Pool>)> {
        let mut v: Vec<_> = self.map.values().map(|(k, p)| (k, p)).collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v
    }

    fn put(&mut self, key: PoolKey, pool: Arc<Pool>) {
        self.map.insert(key.hash(), (key, pool));
    }

    fn remove(&mut self, key: &PoolKey) -> Option<Arc<Pool>> {
        self.map.remove(&key.hash()).map(|(_, p)| p)
    }
}

/// The knn router's memory: pools, conversations, the store.
pub struct Memory {
    pools: ArcSwap<Pools>,
    /// Admin writes, one at a time (the request path never takes it).
    writes: tokio::sync::Mutex<()>,
    pub conversations: Conversations,
    store: OnceLock<Arc<ExampleStore>>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("pools", &self.pools.load().map.len())
            .finish_non_exhaustive()
    }
}

impl Default for Memory {
    fn default() -> Self {
        Self {
            pools: ArcSwap::from_pointee(Pools::default()),
            writes: tokio::sync::Mutex::new(()),
            conversations: Conversations::new(crate::health::clock::ms(
                crate::config::defaults::KNN_CONVERSATION_TTL,
            )),
            store: OnceLock::new(),
        }
    }
}

/// Why examples were not stored.
#[derive(Debug, thiserror::Error)]
pub enum TeachError {
    #[error("the pool's examples have {pool} dimensions and these {given}: forget the pool before teaching it with another embedding model")]
    Dimensions { pool: usize, given: usize },
    #[error("an embedding is all zeros")]
    ZeroVector,
    #[error("{0}")]
    Store(String),
}

impl Memory {
    pub fn pools(&self) -> arc_swap::Guard<Arc<Pools>> {
        self.pools.load()
    }

    /// The store examples are kept in (set once, at start, when a ledger database is
    /// configured); `None`: memory only.
    pub fn store(&self) -> Option<&Arc<ExampleStore>> {
        self.store.get()
    }

    pub fn set_store(&self, store: Arc<ExampleStore>) {
        let _ = self.store.set(store);
    }

    /// Fill the pools from the store (at start); returns the examples loaded. Pools past the
    /// exact limit are indexed here.
    pub fn load(&self, max_per_pool: usize) -> Result<usize, String> {
        let Some(store) = self.store.get() else {
            return Ok(0);
        };
        let rows = store.load_blocking().map_err(|e| e.to_string())?;
        let mut pools: HashMap<PoolKey, Pool> = HashMap::new();
        let mut loaded = 0;
        for r in rows {
            let pool = pools
                .entry(r.key)
                .or_insert_with(|| Pool::new(r.vector.len()));
            let scores: Vec<(Arc<str>, f32)> = r
                .scores
                .into_iter()
                .map(|(n, s)| (Arc::from(n), s))
                .collect();
            if pool.push(&r.vector, &scores, r.id) {
                loaded += 1;
            }
        }
        let mut map = Pools::default();
        for (key, mut pool) in pools {
            pool.truncate_oldest(max_per_pool);
            pool.index();
            map.put(key, Arc::new(pool));
        }
        self.pools.store(Arc::new(map));
        Ok(loaded)
    }

    /// Add examples (vector, scores) to a pool: stored first (when a store is set), then in
    /// memory, the oldest beyond `max` dropped from both. Returns the pool's size.
    pub async fn teach(
        &self,
        key: PoolKey,
        examples: Vec<Taught>,
        max: usize,
    ) -> Result<usize, TeachError> {
        let _write = self.writes.lock().await;
        let current = self.pools.load_full();
        let existing = current
            .get(&key.policy, key.user.as_deref(), key.task.as_deref())
            .cloned();
        let dims = existing
            .as_ref()
            .map_or_else(|| examples.first().map_or(0, |e| e.0.len()), |p| p.dims());
        for (v, _) in &examples {
            if v.len() != dims {
                return Err(TeachError::Dimensions {
                    pool: dims,
                    given: v.len(),
                });
            }
            if crate::routing::knn::search::normalised(v).is_none() {
                return Err(TeachError::ZeroVector);
            }
        }
        let ids = match self.store.get() {
            Some(store) => store
                .insert(key.clone(), &examples, max)
                .await
                .map_err(|e| TeachError::Store(e.to_string()))?,
            None => vec![0; examples.len()],
        };
        let mut pool = existing.map_or_else(|| Pool::new(dims), |p| (*p).clone());
        for ((v, scores), id) in examples.iter().zip(ids) {
            pool.push(v, scores, id);
        }
        pool.truncate_oldest(max);
        let pool = tokio::task::spawn_blocking(move || {
            pool.index();
            pool
        })
        .await
        .map_err(|_| TeachError::Store("indexing the pool failed".into()))?;
        let size = pool.len();
        let mut next = (*current).clone();
        next.put(key, Arc::new(pool));
        self.pools.store(Arc::new(next));
        Ok(size)
    }

    /// Forget a pool (store and memory); returns the examples it held in memory.
    pub async fn forget(&self, key: &PoolKey) -> Result<usize, TeachError> {
        let _write = self.writes.lock().await;
        if let Some(store) = self.store.get() {
            store
                .forget(key.clone())
                .await
                .map_err(|e| TeachError::Store(e.to_string()))?;
        }
        let mut next = (*self.pools.load_full()).clone();
        let gone = next.remove(key).map_or(0, |p| p.len());
        self.pools.store(Arc::new(next));
        Ok(gone)
    }
}

// === Conversations ===

const SLOTS: usize = 1 << 14;
const EXPIRY_BITS: u32 = 40;
const EXPIRY_MASK: u64 = (1 << EXPIRY_BITS) - 1;
const OUTCOME_BITS: u32 = 3;

/// One decision per conversation: (order rank + 1, or 0 for the default's route; outcome).
pub struct Conversations {
    tags: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
    ttl_ms: u64,
}

impl Conversations {
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            tags: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            values: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ttl_ms,
        }
    }

    /// The tag of a conversation under one policy entry of one snapshot generation (never 0).
    pub fn tag(generation: u64, policy: usize, entry: usize, conversation: &[u8]) -> u64 {
        let mut bytes = Vec::with_capacity(conversation.len() + 24);
        bytes.extend_from_slice(&generation.to_le_bytes());
        bytes.extend_from_slice(&(policy as u64).to_le_bytes());
        bytes.extend_from_slice(&(entry as u64).to_le_bytes());
        bytes.extend_from_slice(conversation);
        stable_hash(&bytes).max(1)
    }

    /// The live decision of a conversation: the order's rank (`None`: the default's route)
    /// and how it was made.
    pub fn get(&self, tag: u64, now_ms: u64) -> Option<(Option<usize>, KnnOutcome)> {
        let i = (tag as usize) & (SLOTS - 1);
        if self.tags[i].load(Ordering::Acquire) != tag {
            return None;
        }
        let v = self.values[i].load(Ordering::Acquire);
        let expires = v & EXPIRY_MASK;
        if v == 0 || (now_ms & EXPIRY_MASK) >= expires {
            return None;
        }
        let outcome = KnnOutcome::from_code((v >> EXPIRY_BITS) & ((1 << OUTCOME_BITS) - 1));
        let order = v >> (EXPIRY_BITS + OUTCOME_BITS);
        let order = usize::try_from(order).ok().and_then(|o| o.checked_sub(1));
        Some((order, outcome))
    }

    /// Record a conversation's decision for the ttl.
    pub fn put(&self, tag: u64, order: Option<usize>, outcome: KnnOutcome, now_ms: u64) {
        let i = (tag as usize) & (SLOTS - 1);
        let expires = (now_ms + self.ttl_ms) & EXPIRY_MASK;
        let order = order.map_or(0, |o| o as u64 + 1) & 0x7ff;
        let v = (order << (EXPIRY_BITS + OUTCOME_BITS)) | (outcome.code() << EXPIRY_BITS) | expires;
        self.values[i].store(v, Ordering::Release);
        self.tags[i].store(tag, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::clock::{Clock, ManualClock};

    #[test]
    fn a_conversation_keeps_its_decision_for_the_ttl_on_the_injected_clock() {
        let clock = ManualClock::new();
        let table = Conversations::new(3_600_000);
        let tag = Conversations::tag(1, 0, 0, b"conv-1");
        assert_eq!(table.get(tag, clock.now_ms()), None);
        table.put(tag, Some(3), KnnOutcome::Knn, clock.now_ms());
        clock.advance(std::time::Duration::from_secs(3599));
        assert_eq!(
            table.get(tag, clock.now_ms()),
            Some((Some(3), KnnOutcome::Knn))
        );
        clock.advance(std::time::Duration::from_secs(2));
        assert_eq!(table.get(tag, clock.now_ms()), None);
        table.put(tag, None, KnnOutcome::Cold, clock.now_ms());
        assert_eq!(
            table.get(tag, clock.now_ms()),
            Some((None, KnnOutcome::Cold))
        );
        // Another generation (a reload) or entry is another conversation.
        assert_eq!(
            table.get(Conversations::tag(2, 0, 0, b"conv-1"), clock.now_ms()),
            None
        );
    }

    #[tokio::test]
    async fn pools_are_keyed_by_policy_user_and_task_and_bounded() {
        let m = Memory::default();
        let key = |u: Option<&str>| PoolKey {
            policy: "p".into(),
            user: u.map(str::to_string),
            task: None,
        };
        let ex = |x: f32| (vec![x, 1.0], vec![(Arc::from("a"), 0.5)]);
        assert_eq!(
            m.teach(key(None), vec![ex(1.0), ex(2.0)], 3).await.unwrap(),
            2
        );
        assert_eq!(
            m.teach(key(None), vec![ex(3.0), ex(4.0)], 3).await.unwrap(),
            3
        );
        assert_eq!(m.teach(key(Some("u")), vec![ex(1.0)], 3).await.unwrap(), 1);
        assert!(matches!(
            m.teach(key(None), vec![(vec![1.0, 2.0, 3.0], vec![])], 3)
                .await,
            Err(TeachError::Dimensions { pool: 2, given: 3 })
        ));
        let pools = m.pools();
        assert_eq!(pools.get("p", None, None).map(|p| p.len()), Some(3));
        assert_eq!(pools.get("p", Some("u"), None).map(|p| p.len()), Some(1));
        assert!(pools.get("p", Some("v"), None).is_none());
        assert!(pools.get("q", None, None).is_none());
        drop(pools);
        assert_eq!(m.forget(&key(None)).await.unwrap(), 3);
        assert!(m.pools().get("p", None, None).is_none());
    }
}
