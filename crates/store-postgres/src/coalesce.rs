//! Requests that arrive together share a statement: concurrent claims of one queue become one
//! claim statement, and concurrent batches of successes of one tenant one completion statement.
//!
//! A request that finds no statement of its kind running starts one at once, alone. Requests
//! that arrive while it runs queue behind it and go together in the next statement. So a lone
//! worker sees no added latency, and under load — many workers each claiming and completing
//! one occurrence at a time — the database runs a fraction of the statements and commits
//! (docs/DESIGN.md, "Why do concurrent claims share a statement?").
//!
//! Small requests that came together also wait briefly for each other: after a statement, the
//! next one expects the requests the last one carried plus those that arrived while it ran,
//! and if they would make a small statement it waits for them — at most [`LINGER`], and never
//! longer than the last statement took.
//! Without that, workers answered by one statement come back while the next one runs and
//! split into two cohorts that alternate, each statement carrying half of them
//! (docs/DESIGN.md, "Why does a shared statement wait for the workers it just answered?").
//! Each request is still decided on its own: its own owner, lease and count in the claim, its
//! own fence for each completion.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use campanile_store::StoreError;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// A kind of request that can share a statement.
pub(crate) trait Batch: Send + Sync + 'static {
    /// Requests with equal keys may share a statement.
    type Key: Hash + Eq + Clone + Send + Sync + 'static;
    type Req: Send + 'static;
    type Resp: Send + 'static;

    /// What a statement's requests so far add up to, for [`Batch::admit`].
    type Load: Default;

    /// Whether a request whose caller has stopped waiting is dropped before it reaches a
    /// statement (a claim for nobody would lease occurrences to no one; a completion is
    /// still worth writing).
    const SKIP_ABANDONED: bool;

    /// What of a request whose caller has stopped waiting still goes to a statement (`None`:
    /// nothing). By default all of it, or nothing when [`Batch::SKIP_ABANDONED`].
    fn abandoned(req: Self::Req) -> Option<Self::Req> {
        (!Self::SKIP_ABANDONED).then_some(req)
    }

    /// Whether `req` may join a statement whose requests so far add up to `load`, adding it
    /// if so. The first request of a statement (`load` as new) is always admitted.
    fn admit(load: &mut Self::Load, req: &Self::Req, first: bool) -> bool;

    /// The rows `req` may touch.
    fn weight(req: &Self::Req) -> usize;

    /// Runs one statement for `reqs`: one answer per request, in order, or the statement's
    /// error, which every request that shared it gets.
    fn run(
        &self,
        reqs: Vec<Self::Req>,
    ) -> impl Future<Output = Result<Vec<Self::Resp>, StoreError>> + Send;
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
    /// Requests queued since a statement last took its requests, and the rows they may touch.
    arrived: usize,
    arrived_weight: usize,
    /// Tasks waiting for company ([`Coalescer::linger`]): a request queued wakes them.
    lingering: usize,
}

/// Most statements of one key in flight at once.
const IN_FLIGHT: usize = 2;

/// A second statement of a key starts, rather than wait for the first, once the requests
/// waiting would touch this many rows: small requests gain most from sharing a statement
/// (its fixed cost dominates), large ones from running beside another (two cores, two
/// statements).
const PARALLEL_WEIGHT: usize = 200;

/// A statement waits for company only when the requests it expects would touch at most this
/// many rows (and only while fewer wait): a shared report+claim transaction costs about 1 ms
/// fixed and 0.09 ms per report of one occurrence (two rows), so below about 12 reports the
/// fixed cost dominates and carrying twice as many nearly halves it per occurrence. A larger
/// statement starts at once, so the database works while the requests it just answered make
/// their way back (measured: waiting at 32 batch-1 workers cost 8–22%).
const LINGER_WEIGHT: usize = 24;

/// Longest a statement of small requests waits for the requests it expects
/// ([`Coalescer::linger`]).
pub(crate) const LINGER: Duration = Duration::from_millis(1);

/// Runs requests of one [`Batch`] kind, sharing statements among those that wait together.
pub(crate) struct Coalescer<B: Batch> {
    batch: B,
    /// A key is present while a task runs its statements.
    groups: Mutex<HashMap<B::Key, Group<B>>>,
    /// Woken when a request queues for a statement that waits for company.
    queued: Notify,
    /// Longest a statement waits for company.
    linger: Duration,
}

impl<B: Batch> Coalescer<B> {
    pub(crate) fn new(batch: B) -> Arc<Coalescer<B>> {
        Self::lingering(batch, LINGER)
    }

    /// A coalescer whose statements wait at most `linger` for company.
    pub(crate) fn lingering(batch: B, linger: Duration) -> Arc<Coalescer<B>> {
        Arc::new(Coalescer {
            batch,
            groups: Mutex::new(HashMap::new()),
            queued: Notify::new(),
            linger,
        })
    }

    /// Runs `req`, in a statement of its own or shared with others of the same key.
    pub(crate) async fn call(
        self: &Arc<Self>,
        key: B::Key,
        req: B::Req,
    ) -> Result<B::Resp, StoreError> {
        let (tx, rx) = oneshot::channel();
        let mut wake = false;
        let start = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            match groups.entry(key.clone()) {
                Entry::Occupied(mut e) => {
                    let group = e.get_mut();
                    group.weight += B::weight(&req);
                    group.arrived += 1;
                    group.arrived_weight += B::weight(&req);
                    group.waiting.push_back((req, tx));
                    wake = group.lingering > 0;
                    let start = group.running == 0
                        || (group.running < IN_FLIGHT && group.weight >= PARALLEL_WEIGHT);
                    group.running += usize::from(start);
                    start
                }
                Entry::Vacant(e) => {
                    e.insert(Group {
                        weight: B::weight(&req),
                        arrived_weight: B::weight(&req),
                        waiting: VecDeque::from([(req, tx)]),
                        running: 1,
                        arrived: 1,
                        lingering: 0,
                    });
                    true
                }
            }
        };
        if wake {
            self.queued.notify_waiters();
        }
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
        // How many requests the next statement expects, and until when it waits for them.
        let mut company = 0;
        let mut until = Instant::now();
        loop {
            if company > 1 {
                self.linger(&key, company, until).await;
            }
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
                group.arrived = 0;
                group.arrived_weight = 0;
                taken
            };
            if taken.is_empty() {
                company = 0;
                continue; // every request waiting had been abandoned
            }
            let (reqs, txs): (Vec<_>, Vec<_>) = taken.into_iter().unzip();
            let n = reqs.len();
            let weight: usize = reqs.iter().map(B::weight).sum();
            let started = Instant::now();
            let result = self.batch.run(reqs).await;
            // The requests just answered are likely to come back (workers in a loop), and
            // those that arrived meanwhile wait already: the next statement expects both,
            // and waits for them if they would make a small statement.
            let ran = started.elapsed();
            let (arrived, arrived_weight) = self
                .groups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .map_or((0, 0), |g| (g.arrived, g.arrived_weight));
            company = if weight + arrived_weight <= LINGER_WEIGHT {
                n + arrived
            } else {
                0
            };
            until = Instant::now() + ran.min(self.linger);
            match result {
                Ok(answers) => {
                    let mut answers = answers.into_iter();
                    for tx in txs {
                        let _ = tx.send(answers.next().ok_or_else(|| {
                            StoreError::Database(format!(
                                "a shared statement answered fewer than its {n} requests"
                            ))
                        }));
                    }
                }
                Err(e) => {
                    for tx in txs {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Waits, at most until `until`, while fewer than `company` requests of `key` wait and
    /// they are small (weighing less than [`LINGER_WEIGHT`]): so that workers answered
    /// together go together again instead of splitting between two statements.
    async fn linger(&self, key: &B::Key, company: usize, until: Instant) {
        let mut counted = false;
        loop {
            let queued = self.queued.notified();
            tokio::pin!(queued);
            // Registered before the check, so a request queued after it still wakes this.
            queued.as_mut().enable();
            {
                let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                match groups.get_mut(key) {
                    Some(g) if g.waiting.len() < company && g.weight < LINGER_WEIGHT => {
                        g.lingering += usize::from(!counted);
                        counted = true;
                    }
                    _ => break,
                }
            }
            if tokio::time::timeout_at(until, queued).await.is_err() {
                break;
            }
        }
        if counted {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(g) = groups.get_mut(key) {
                g.lingering = g.lingering.saturating_sub(1);
            }
        }
    }
}

/// The requests of the next statement: the first in line, then every later one that fits,
/// in arrival order; those that do not fit keep their place. Abandoned requests keep only
/// what [`Batch::abandoned`] leaves of them.
fn take<B: Batch>(queue: &mut Waiting<B>) -> Vec<Pending<B>> {
    let mut taken: Vec<Pending<B>> = Vec::new();
    let mut load = B::Load::default();
    let mut kept = VecDeque::new();
    while let Some((req, tx)) = queue.pop_front() {
        let req = if tx.is_closed() {
            match B::abandoned(req) {
                Some(req) => req,
                None => continue,
            }
        } else {
            req
        };
        if B::admit(&mut load, &req, taken.is_empty()) {
            taken.push((req, tx));
        } else {
            kept.push_back((req, tx));
        }
    }
    *queue = kept;
    taken
}

/// Accounts for a task that ends without emptying its key's queue (a panicking statement):
/// the queue is left to another task of the key if one runs, else removed — its waiters are
/// answered with an error as their senders drop — so the next request starts afresh.
struct Unqueue<'a, B: Batch> {
    owner: &'a Coalescer<B>,
    key: Option<B::Key>,
}

impl<B: Batch> Drop for Unqueue<'_, B> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut groups = self.owner.groups.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(group) = groups.get_mut(&key) {
                group.running = group.running.saturating_sub(1);
                if group.running == 0 {
                    groups.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Doubles numbers and records every statement's requests. While `hold` is set, a
    /// statement waits before answering (so the test decides who queues behind it); a
    /// request of 0 makes its statement panic.
    #[derive(Default)]
    struct Doubler {
        statements: Mutex<Vec<Vec<u32>>>,
        hold: AtomicBool,
        running: AtomicUsize,
        most_running: AtomicUsize,
    }

    impl Batch for Arc<Doubler> {
        type Key = u8;
        type Req = u32;
        type Resp = u32;
        type Load = u32;
        const SKIP_ABANDONED: bool = true;

        fn admit(load: &mut u32, req: &u32, first: bool) -> bool {
            let fits = first || *load + req <= 1000;
            if fits {
                *load += req;
            }
            fits
        }

        fn weight(req: &u32) -> usize {
            *req as usize
        }

        async fn run(&self, reqs: Vec<u32>) -> Result<Vec<u32>, StoreError> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_running.fetch_max(now, Ordering::SeqCst);
            self.statements.lock().unwrap().push(reqs.clone());
            while self.hold.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            assert!(!reqs.contains(&0), "a statement fails hard");
            Ok(reqs.iter().map(|r| r * 2).collect())
        }
    }

    fn coalescer() -> (Arc<Doubler>, Arc<Coalescer<Arc<Doubler>>>) {
        let d = Arc::new(Doubler::default());
        (d.clone(), Coalescer::new(d))
    }

    /// A coalescer whose statements wait up to `linger` for company.
    fn lingering(linger: Duration) -> (Arc<Doubler>, Arc<Coalescer<Arc<Doubler>>>) {
        let d = Arc::new(Doubler::default());
        (d.clone(), Coalescer::lingering(d, linger))
    }

    fn call(
        c: &Arc<Coalescer<Arc<Doubler>>>,
        key: u8,
        n: u32,
    ) -> tokio::task::JoinHandle<Result<u32, StoreError>> {
        let c = c.clone();
        tokio::spawn(async move { c.call(key, n).await })
    }

    /// Waits until `done` holds, polling; fails the test with `never` if that takes 30 s
    /// (a liveness guard instead of a hang).
    async fn eventually(never: impl std::fmt::Display, mut done: impl FnMut() -> bool) {
        let wait = async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .unwrap_or_else(|_| panic!("{never}"));
    }

    /// Waits until `n` statements run and `queued` requests of `key` wait.
    async fn until(d: &Doubler, c: &Coalescer<Arc<Doubler>>, key: u8, n: usize, queued: usize) {
        eventually(format!("never {n} running with {queued} queued"), || {
            let waiting = c
                .groups
                .lock()
                .unwrap()
                .get(&key)
                .map_or(0, |g| g.waiting.len());
            d.running.load(Ordering::SeqCst) == n && waiting == queued
        })
        .await;
    }

    /// Waits until no task runs and nothing is queued: the last task removes its key right
    /// after sending its answers, so the callers may see them first.
    async fn idle(c: &Coalescer<Arc<Doubler>>) {
        eventually("a key was left behind", || {
            c.groups.lock().unwrap().is_empty()
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_request_runs_at_once_and_requests_arriving_meanwhile_share_the_next() {
        let (d, c) = coalescer();
        assert_eq!(c.call(1, 5).await.unwrap(), 10);
        d.hold.store(true, Ordering::SeqCst);
        let first = call(&c, 1, 1);
        until(&d, &c, 1, 1, 0).await;
        let rest: Vec<_> = (2..=6).map(|n| call(&c, 1, n)).collect();
        until(&d, &c, 1, 1, 5).await;
        d.hold.store(false, Ordering::SeqCst);
        assert_eq!(first.await.unwrap().unwrap(), 2);
        for (n, t) in (2..=6).zip(rest) {
            assert_eq!(t.await.unwrap().unwrap(), n * 2, "each gets its own answer");
        }
        let mut statements = d.statements.lock().unwrap().clone();
        if let Some(last) = statements.last_mut() {
            last.sort_unstable();
        }
        assert_eq!(statements, vec![vec![5], vec![1], vec![2, 3, 4, 5, 6]]);
        idle(&c).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heavy_requests_get_a_second_statement_and_oversized_ones_wait_their_turn() {
        let (d, c) = coalescer();
        d.hold.store(true, Ordering::SeqCst);
        let first = call(&c, 7, 10);
        until(&d, &c, 7, 1, 0).await;
        // 300 waiting is heavy enough for a second statement beside the first; 900 does not
        // fit with it and waits for the next.
        let heavy = call(&c, 7, 300);
        until(&d, &c, 7, 2, 0).await;
        let oversized = call(&c, 7, 900);
        until(&d, &c, 7, 2, 1).await;
        d.hold.store(false, Ordering::SeqCst);
        for t in [first, heavy, oversized] {
            t.await.unwrap().unwrap();
        }
        let statements = d.statements.lock().unwrap().clone();
        assert_eq!(statements, vec![vec![10], vec![300], vec![900]]);
        assert_eq!(d.most_running.load(Ordering::SeqCst), IN_FLIGHT);
        idle(&c).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_gives_up_strands_nobody_and_a_failed_statement_answers_everyone() {
        let (d, c) = coalescer();
        // The first caller gives up while its statement runs; the one queued behind still runs.
        d.hold.store(true, Ordering::SeqCst);
        let first = call(&c, 2, 3);
        until(&d, &c, 2, 1, 0).await;
        let behind = call(&c, 2, 4);
        until(&d, &c, 2, 1, 1).await;
        // A caller that gives up while still queued never reaches a statement.
        let gone = call(&c, 2, 6);
        until(&d, &c, 2, 1, 2).await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        first.abort();
        d.hold.store(false, Ordering::SeqCst);
        assert_eq!(behind.await.unwrap().unwrap(), 8);
        assert_eq!(*d.statements.lock().unwrap(), vec![vec![3], vec![4]]);

        // A statement that panics: its request and the one waiting behind it get an error,
        // and the next request starts afresh.
        d.hold.store(true, Ordering::SeqCst);
        let doomed = call(&c, 3, 0);
        until(&d, &c, 3, 1, 0).await;
        let waiting = call(&c, 3, 9);
        until(&d, &c, 3, 1, 1).await;
        d.hold.store(false, Ordering::SeqCst);
        assert!(doomed.await.unwrap().is_err());
        assert!(waiting.await.unwrap().is_err());
        assert_eq!(c.call(3, 21).await.unwrap(), 42);
        idle(&c).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_answered_together_wait_for_each_other_in_the_next_statement() {
        // A linger far longer than the test's guard: a statement that waited for company that
        // never comes would fail the guard instead of passing slowly.
        let (d, c) = lingering(Duration::from_secs(60));
        let guard = Duration::from_secs(20);
        // A lone worker never waits: each request runs at once in a statement of its own.
        for n in 1..=5 {
            let answer = tokio::time::timeout(guard, c.call(4, n)).await;
            assert_eq!(answer.expect("a lone request waited").unwrap(), n * 2);
        }
        idle(&c).await;
        d.statements.lock().unwrap().clear();

        // 2 and 3 arrive while 1 runs, so the next statement expects three requests: it waits
        // for the worker 1 answered (back as 4) instead of splitting them in two statements.
        d.hold.store(true, Ordering::SeqCst);
        let first = call(&c, 4, 1);
        until(&d, &c, 4, 1, 0).await;
        let rest: Vec<_> = (2..=3).map(|n| call(&c, 4, n)).collect();
        until(&d, &c, 4, 1, 2).await;
        d.hold.store(false, Ordering::SeqCst);
        assert_eq!(first.await.unwrap().unwrap(), 2);
        let back = call(&c, 4, 4);
        for (n, t) in (2..=4).zip(rest.into_iter().chain([back])) {
            let answer = tokio::time::timeout(guard, t)
                .await
                .expect("never answered");
            assert_eq!(answer.unwrap().unwrap(), n * 2);
        }
        let mut statements = d.statements.lock().unwrap().clone();
        if let Some(last) = statements.last_mut() {
            last.sort_unstable();
        }
        assert_eq!(statements, vec![vec![1], vec![2, 3, 4]]);
        idle(&c).await;
    }

    /// Runs `first` alone, queues `second` while it runs, then lets the statements go.
    async fn one_arrives_meanwhile(
        d: &Doubler,
        c: &Arc<Coalescer<Arc<Doubler>>>,
        key: u8,
        first: u32,
        second: u32,
    ) -> (
        tokio::task::JoinHandle<Result<u32, StoreError>>,
        tokio::task::JoinHandle<Result<u32, StoreError>>,
    ) {
        d.hold.store(true, Ordering::SeqCst);
        let first = call(c, key, first);
        until(d, c, key, 1, 0).await;
        let second = call(c, key, second);
        until(d, c, key, 1, 1).await;
        d.hold.store(false, Ordering::SeqCst);
        (first, second)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_waits_for_company_at_most_the_linger_and_never_when_it_is_large() {
        // Company that never comes costs at most the linger: 2 arrives while 1 runs, 1's
        // caller never comes back, and 2 still runs.
        let (d, c) = lingering(Duration::from_millis(50));
        let (first, second) = one_arrives_meanwhile(&d, &c, 5, 1, 2).await;
        assert_eq!(first.await.unwrap().unwrap(), 2);
        assert_eq!(second.await.unwrap().unwrap(), 4);
        assert_eq!(*d.statements.lock().unwrap(), vec![vec![1], vec![2]]);
        idle(&c).await;

        // A statement expected to touch more than LINGER_WEIGHT rows starts at once, however
        // long the linger: 10 and 20 would make 30.
        let (d, c) = lingering(Duration::from_secs(60));
        let (first, second) = one_arrives_meanwhile(&d, &c, 6, 10, 20).await;
        assert_eq!(first.await.unwrap().unwrap(), 20);
        let answer = tokio::time::timeout(Duration::from_secs(20), second).await;
        assert_eq!(
            answer.expect("a large statement waited").unwrap().unwrap(),
            40
        );
        assert_eq!(*d.statements.lock().unwrap(), vec![vec![10], vec![20]]);
        idle(&c).await;
    }
}
