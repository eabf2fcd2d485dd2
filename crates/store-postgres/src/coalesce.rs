//! Requests that arrive together share a statement: concurrent claims of one queue become one
//! claim statement, and concurrent batches of successes of one tenant one completion statement.
//!
//! A request that finds no statement of its kind running starts one at once, alone: nothing
//! waits for company. Requests that arrive while it runs queue behind it and go together in
//! the next statement. So a lone worker sees no added latency, and under load — many workers
//! each claiming and completing one occurrence at a time — the database runs a fraction of
//! the statements and commits (docs/DESIGN.md, "Why do concurrent claims share a statement?").
//! Each request is still decided on its own: its own owner, lease and count in the claim, its
//! own fence for each completion.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use campanile_store::StoreError;
use tokio::sync::oneshot;

/// A kind of request that can share a statement.
pub(crate) trait Batch: Send + Sync + 'static {
    /// Requests with equal keys may share a statement.
    type Key: Hash + Eq + Clone + Send + 'static;
    type Req: Send + 'static;
    type Resp: Send + 'static;

    /// Whether `req` may join the requests already `taken` for one statement (the first
    /// request of a statement is always taken).
    fn fits(taken: &[Self::Req], req: &Self::Req) -> bool;

    /// The rows `req` may touch.
    fn weight(req: &Self::Req) -> usize;

    /// Runs one statement for `reqs`; one answer per request, in order.
    fn run(
        &self,
        reqs: Vec<Self::Req>,
    ) -> impl Future<Output = Vec<Result<Self::Resp, StoreError>>> + Send;
}

/// A request and where its answer goes.
type Pending<B> = (
    <B as Batch>::Req,
    oneshot::Sender<Result<<B as Batch>::Resp, StoreError>>,
);

type Waiting<B> = VecDeque<Pending<B>>;

/// The requests of one key that wait (and the rows they may touch), and how many tasks run
/// statements for them.
struct Group<B: Batch> {
    waiting: Waiting<B>,
    weight: usize,
    running: usize,
}

/// Most statements of one key in flight at once.
const IN_FLIGHT: usize = 2;

/// A second statement of a key starts, rather than wait for the first, once the requests
/// waiting would touch this many rows: small requests gain most from sharing a statement
/// (its fixed cost dominates), large ones from running beside another (two cores, two
/// statements).
const PARALLEL_WEIGHT: usize = 200;

/// Runs requests of one [`Batch`] kind, sharing statements among those that wait together.
pub(crate) struct Coalescer<B: Batch> {
    batch: B,
    /// A key is present while a task runs its statements.
    groups: Mutex<HashMap<B::Key, Group<B>>>,
}

impl<B: Batch> Coalescer<B> {
    pub(crate) fn new(batch: B) -> Arc<Coalescer<B>> {
        Arc::new(Coalescer {
            batch,
            groups: Mutex::new(HashMap::new()),
        })
    }

    /// Runs `req`, in a statement of its own or shared with others of the same key.
    pub(crate) async fn call(
        self: &Arc<Self>,
        key: B::Key,
        req: B::Req,
    ) -> Result<B::Resp, StoreError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            match groups.entry(key.clone()) {
                Entry::Occupied(mut e) => {
                    let group = e.get_mut();
                    group.weight += B::weight(&req);
                    group.waiting.push_back((req, tx));
                    let start = group.running == 0
                        || (group.running < IN_FLIGHT && group.weight >= PARALLEL_WEIGHT);
                    group.running += usize::from(start);
                    start
                }
                Entry::Vacant(e) => {
                    e.insert(Group {
                        weight: B::weight(&req),
                        waiting: VecDeque::from([(req, tx)]),
                        running: 1,
                    });
                    true
                }
            }
        };
        // The statements run in a task of their own, so a caller that gives up (a client
        // that hangs up) never strands the requests queued behind its own.
        if start {
            tokio::spawn(Arc::clone(self).drain(key));
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the shared statement stopped before answering".into(),
            ))
        })
    }

    /// Runs statements for `key` until nobody waits.
    async fn drain(self: Arc<Self>, key: B::Key) {
        // Should a statement panic, the queue goes with the task: its waiters are answered
        // with an error (their senders drop) instead of waiting for ever, and the next
        // request starts afresh.
        let mut guard = Unqueue {
            owner: &self,
            key: Some(key.clone()),
        };
        loop {
            let taken = {
                let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                let Some(group) = groups.get_mut(&key) else {
                    guard.key = None;
                    break;
                };
                if group.waiting.is_empty() {
                    group.running -= 1;
                    if group.running == 0 {
                        groups.remove(&key);
                    }
                    guard.key = None;
                    break;
                }
                let taken = take::<B>(&mut group.waiting);
                group.weight = group.waiting.iter().map(|(r, _)| B::weight(r)).sum();
                taken
            };
            let (reqs, txs): (Vec<_>, Vec<_>) = taken.into_iter().unzip();
            let n = reqs.len();
            let mut answers = self.batch.run(reqs).await.into_iter();
            for tx in txs {
                let answer = answers.next().unwrap_or_else(|| {
                    Err(StoreError::Database(format!(
                        "a shared statement answered fewer than its {n} requests"
                    )))
                });
                let _ = tx.send(answer);
            }
        }
    }
}

/// The requests of the next statement: the first in line, then every later one that fits,
/// in arrival order; those that do not fit keep their place.
fn take<B: Batch>(queue: &mut Waiting<B>) -> Vec<Pending<B>> {
    let mut taken: Vec<B::Req> = Vec::new();
    let mut txs = Vec::new();
    let mut kept = VecDeque::new();
    while let Some((req, tx)) = queue.pop_front() {
        if taken.is_empty() || B::fits(&taken, &req) {
            taken.push(req);
            txs.push(tx);
        } else {
            kept.push_back((req, tx));
        }
    }
    *queue = kept;
    taken.into_iter().zip(txs).collect()
}

/// Removes a key's queue if its task ends without emptying it.
struct Unqueue<'a, B: Batch> {
    owner: &'a Coalescer<B>,
    key: Option<B::Key>,
}

impl<B: Batch> Drop for Unqueue<'_, B> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut groups = self.owner.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.remove(&key);
        }
    }
}

/// A copy of a statement's error for each request that shared it.
pub(crate) fn copy_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(s) => StoreError::Unavailable(s.clone()),
        StoreError::Invalid(s) => StoreError::Invalid(s.clone()),
        other => StoreError::Database(other.to_string()),
    }
}
