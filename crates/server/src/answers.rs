//! Memory held by answers in flight: one budget per node ([`crate::ServerConfig::answer_memory`]).
//!
//! A list or claim answer is bounded on its own ([`ANSWER_BYTES`]), but a node
//! answers many at once, and an answer stays in memory until its client has read it. Each
//! such answer holds its share of the node's budget from before its records are read until
//! its body is sent (or its connection closed): a burst of large answers waits for room
//! instead of growing the process toward the OOM killer.
//!
//! One tenant's answers hold at most half of the budget ([`AnswerMemory::hold`]): a tenant
//! whose workers all claim at once (the top of the hour) waits behind its own claims, not
//! every other tenant behind it (docs/DESIGN.md, "Why does one tenant hold at most half of
//! the answer memory?").

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::response::Response;
use campanile_store::TenantId;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in units of this many bytes.
const UNIT: usize = 1024;

/// What an answer of `n` bytes takes from the budget while it is built: its records as read
/// and their JSON live side by side until the JSON is complete, so twice its size. Once built,
/// it keeps only its JSON's size ([`AnswerHold::shrink_to`]).
const BUILDING: usize = 2;

/// The node's budget for answers in flight.
#[derive(Debug, Clone)]
pub(crate) struct AnswerMemory {
    units: Arc<Semaphore>,
    /// The whole budget, in units.
    total: usize,
    /// Each tenant's own share of the budget while it holds some: [`AnswerMemory::share`]
    /// units, of which its holds take theirs before they take the node's. An entry is removed
    /// when its tenant's last hold ends or stops waiting, so there are never more than
    /// tenants with answers in flight or waiting.
    tenants: Arc<Mutex<HashMap<TenantId, Arc<Semaphore>>>>,
    /// The most one tenant's answers hold at once, in units: half the budget.
    share: usize,
}

impl AnswerMemory {
    /// A budget of `bytes` (never below one whole answer being built,
    /// [`AnswerMemory::MIN_BYTES`]).
    pub(crate) fn new(bytes: usize) -> AnswerMemory {
        let total = bytes.max(Self::MIN_BYTES).div_ceil(UNIT);
        AnswerMemory {
            units: Arc::new(Semaphore::new(total)),
            total,
            tenants: Arc::default(),
            // Never below one whole answer being built: any one answer can still be made.
            share: (total / 2).max((ANSWER_BYTES * BUILDING).div_ceil(UNIT)),
        }
    }

    /// The smallest budget: one whole answer ([`ANSWER_BYTES`]) being built.
    pub(crate) const MIN_BYTES: usize = ANSWER_BYTES * BUILDING;

    /// A hold for an answer to `tenant` of up to `want` bytes: as much as is free now, but at
    /// least `floor` bytes (for which it waits). An answer sized by its hold
    /// ([`AnswerHold::bytes`]) shrinks under load rather than wait for a whole answer's room.
    /// What is free is the lesser of what the node has free and what is left of the tenant's
    /// share, and the hold takes from both; it waits first for its tenant's share (behind
    /// that tenant's earlier holds only), then for the node's.
    pub(crate) async fn hold(&self, tenant: TenantId, want: usize, floor: usize) -> AnswerHold {
        let want = want
            .saturating_mul(BUILDING)
            .div_ceil(UNIT)
            .clamp(BUILDING, self.share);
        let floor = floor
            .saturating_mul(BUILDING)
            .div_ceil(UNIT)
            .clamp(BUILDING, want);
        // Declared before the share's reference, so dropped after it: whether the hold is
        // made or given up while it waits, the share is then forgotten if nothing holds it.
        let _forget = Forget {
            memory: self,
            tenant,
        };
        let own = Arc::clone(
            self.tenants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(tenant)
                .or_insert_with(|| Arc::new(Semaphore::new(self.share))),
        );
        let free = self.units.available_permits().min(own.available_permits());
        let units = u32::try_from(free.clamp(floor, want)).unwrap_or(u32::MAX);
        let mut share = Arc::clone(&own).acquire_many_owned(units).await.ok();
        let mut permit = Arc::clone(&self.units).acquire_many_owned(units).await.ok();
        // A hold that had to wait takes, besides, what has come free meanwhile: a claim sized
        // by its floor alone would answer a fraction of what it asked for.
        let more = (want - units as usize)
            .min(own.available_permits())
            .min(self.units.available_permits());
        if let (Some(p), Some(s), Ok(more)) = (permit.as_mut(), share.as_mut(), u32::try_from(more))
            && more > 0
            && let Ok(extra_share) = Arc::clone(&own).try_acquire_many_owned(more)
        {
            match Arc::clone(&self.units).try_acquire_many_owned(more) {
                Ok(extra) => {
                    s.merge(extra_share);
                    p.merge(extra);
                }
                Err(_) => drop(extra_share),
            }
        }
        let hold = AnswerHold {
            permit,
            share,
            tenant,
            gauge: Gauge(self.clone()),
        };
        hold.gauge.set();
        hold
    }

    /// Bytes held now by answers in flight.
    fn held_bytes(&self) -> usize {
        (self.total - self.units.available_permits()) * UNIT
    }

    /// Forgets `tenant`'s share once none of it is held and no hold of it is being made (each
    /// holds a reference to it).
    fn release_share(&self, tenant: TenantId) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(own) = tenants.get(&tenant)
            && Arc::strong_count(own) == 1
            && own.available_permits() == self.share
        {
            tenants.remove(&tenant);
        }
    }
}

/// Forgets a tenant's share, if nothing holds it, when a hold of it is made or given up (its
/// caller gone while it waited).
struct Forget<'a> {
    memory: &'a AnswerMemory,
    tenant: TenantId,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.memory.release_share(self.tenant);
    }
}

/// Publishes what the budget holds as `campanile_http_answer_bytes_held`.
#[derive(Debug)]
struct Gauge(AnswerMemory);

impl Gauge {
    fn set(&self) {
        metrics::gauge!("campanile_http_answer_bytes_held").set(self.0.held_bytes() as f64);
    }
}

/// An answer's share of the node's budget ([`AnswerMemory::hold`]).
#[derive(Debug)]
pub(crate) struct AnswerHold {
    /// `None` only if the budget were closed (it never is): then nothing is held.
    permit: Option<OwnedSemaphorePermit>,
    /// The same units, of the tenant's share.
    share: Option<OwnedSemaphorePermit>,
    tenant: TenantId,
    gauge: Gauge,
}

impl AnswerHold {
    /// The size of the answer this holds room for, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, |p| p.num_permits() * UNIT / BUILDING)
    }

    /// Keeps only what an answer of `bytes` needs once built, giving the rest back (once an
    /// answer is built, it holds its own size until sent, not the room it was given).
    pub(crate) fn shrink_to(&mut self, bytes: usize) {
        let keep = bytes.div_ceil(UNIT).max(1);
        for p in [self.permit.as_mut(), self.share.as_mut()]
            .into_iter()
            .flatten()
        {
            if p.num_permits() > keep {
                drop(p.split(p.num_permits() - keep));
            }
        }
        self.gauge.set();
    }

    /// `resp`, holding this until its body has been sent or dropped.
    pub(crate) fn attach(self, resp: Response) -> Response {
        resp.map(|inner| {
            Body::new(HeldBody {
                inner,
                rest: Bytes::new(),
                hold: self,
            })
        })
    }
}

impl Drop for AnswerHold {
    fn drop(&mut self) {
        drop(self.permit.take());
        drop(self.share.take());
        self.gauge.0.release_share(self.tenant);
        self.gauge.set();
    }
}

/// A response body that keeps its answer's hold until it is done with. The answer goes out
/// in frames of at most [`FRAME`] bytes: hyper takes the next frame only once it has written
/// most of the last, so the body — and its hold — lasts as long as its bytes are unsent (a
/// single frame would be taken whole at once, and the hold dropped with the body while the
/// bytes wait for the client).
struct HeldBody {
    inner: Body,
    /// What is left of the frame being sent.
    rest: Bytes,
    #[allow(dead_code)] // held for its `Drop`
    hold: AnswerHold,
}

/// The largest frame of a held answer.
const FRAME: usize = 64 << 10;

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if !this.rest.is_empty() {
            let n = this.rest.len().min(FRAME);
            return Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(n)))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    if data.len() > FRAME {
                        this.rest = data.split_off(FRAME);
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// The size bound of one answer that lists records (schedules, occurrences), in bytes of
/// JSON: a page stops before the record that would pass it (a page always holds at least
/// one record) and says `truncated`. Records are read in chunks small enough that the chunk
/// in hand stays within the bound whatever their payloads and results hold, so memory per
/// answer follows this bound, not `limit` times the largest payload.
pub const ANSWER_BYTES: usize = 8 << 20;

/// Room for a record's fields besides its payload or result, in bytes of JSON.
pub(crate) const RECORD_OVERHEAD: usize = 4 << 10;

/// An answer under construction that keeps to [`ANSWER_BYTES`].
#[derive(Debug)]
pub(crate) struct AnswerBudget {
    left: usize,
    empty: bool,
}

impl AnswerBudget {
    pub(crate) fn new() -> AnswerBudget {
        AnswerBudget {
            left: ANSWER_BYTES,
            empty: true,
        }
    }

    /// Bytes of JSON counted so far.
    pub(crate) fn used(&self) -> usize {
        ANSWER_BYTES - self.left
    }

    /// Whether `record` fits (the first one always does); if it does, it is counted.
    pub(crate) fn fits(&mut self, record: &impl serde::Serialize) -> bool {
        let mut counter = ByteCount(0);
        let size = serde_json::to_writer(&mut counter, record).map_or(usize::MAX, |()| counter.0);
        if !self.empty && size > self.left {
            return false;
        }
        self.empty = false;
        self.left = self.left.saturating_sub(size + 1);
        true
    }
}

/// Counts what is written to it, keeping nothing.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(bytes: usize) -> AnswerMemory {
        AnswerMemory::new(bytes)
    }

    /// Nothing of the budget is held, and no tenant's share is kept.
    fn assert_all_given_back(m: &AnswerMemory) {
        assert_eq!(m.held_bytes(), 0);
        assert!(
            m.tenants.lock().expect("tenants").is_empty(),
            "no share kept"
        );
    }

    const A: TenantId = TenantId(1);
    const B: TenantId = TenantId(2);
    const C: TenantId = TenantId(3);

    #[tokio::test]
    async fn holds_take_what_is_free_down_to_their_floor_and_give_back_on_shrink_and_drop() {
        let m = memory(AnswerMemory::MIN_BYTES * 4);
        let mut a = m.hold(A, ANSWER_BYTES, 1).await;
        assert_eq!(a.bytes(), ANSWER_BYTES);
        assert_eq!(m.held_bytes(), ANSWER_BYTES * BUILDING, "room to build it");
        let b = m.hold(B, ANSWER_BYTES * 4, 1).await;
        assert_eq!(
            b.bytes(),
            ANSWER_BYTES * 2,
            "its tenant's share at most, not what it asked"
        );
        let c = m.hold(C, ANSWER_BYTES, 1).await;
        assert_eq!(m.held_bytes(), ANSWER_BYTES * BUILDING * 4, "all of it");
        // Nothing free: a hold waits for its floor, then takes what came free meanwhile.
        let m2 = m.clone();
        let waiting = tokio::spawn(async move { m2.hold(C, ANSWER_BYTES, 4096).await.bytes() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        a.shrink_to(10_000);
        let got = waiting.await.expect("hold");
        assert_eq!(
            got,
            (ANSWER_BYTES * BUILDING - 10 * UNIT) / BUILDING,
            "all that came free, not only its floor"
        );
        // (That hold is dropped with its task.)
        assert_eq!(m.held_bytes(), 10 * UNIT + ANSWER_BYTES * BUILDING * 3);
        drop((a, b, c));
        assert_all_given_back(&m);
    }

    /// A tenant whose answers hold half the budget waits behind its own answers; another
    /// tenant's answer is not queued behind it.
    #[tokio::test]
    async fn one_tenant_holds_at_most_half_and_others_do_not_wait_behind_it() {
        let m = memory(AnswerMemory::MIN_BYTES * 4);
        let a1 = m.hold(A, ANSWER_BYTES, 1).await;
        let a2 = m.hold(A, ANSWER_BYTES, 1).await;
        assert_eq!(
            m.held_bytes(),
            ANSWER_BYTES * BUILDING * 2,
            "half of the budget"
        );
        let m2 = m.clone();
        let a3 = tokio::spawn(async move { m2.hold(A, ANSWER_BYTES, 1).await.bytes() });
        tokio::task::yield_now().await;
        assert!(
            !a3.is_finished(),
            "A waits for its own share, with half the node free"
        );
        let b = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            m.hold(B, ANSWER_BYTES, 1),
        )
        .await
        .expect("B is not queued behind A's waiting answer");
        assert_eq!(b.bytes(), ANSWER_BYTES);
        drop(a1);
        assert_eq!(
            a3.await.expect("hold"),
            ANSWER_BYTES,
            "A's next answer, whole"
        );
        drop((a2, b));
        assert_eq!(m.held_bytes(), 0);
    }

    /// A hold given up while it waits (its caller gone) leaves no share behind.
    #[tokio::test]
    async fn a_hold_given_up_while_waiting_leaves_no_share() {
        let m = memory(AnswerMemory::MIN_BYTES * 4);
        let b = m.hold(B, ANSWER_BYTES * 2, 1).await;
        let c = m.hold(C, ANSWER_BYTES * 2, 1).await;
        assert_eq!(m.held_bytes(), ANSWER_BYTES * BUILDING * 4, "all of it");
        let m2 = m.clone();
        let given_up = tokio::spawn(async move { m2.hold(A, ANSWER_BYTES, 1).await.bytes() });
        tokio::task::yield_now().await;
        assert!(!given_up.is_finished(), "A waits for the node's room");
        assert!(m.tenants.lock().expect("tenants").contains_key(&A));
        given_up.abort();
        assert!(given_up.await.is_err());
        assert!(
            !m.tenants.lock().expect("tenants").contains_key(&A),
            "A's share forgotten"
        );
        drop((b, c));
        assert_all_given_back(&m);
    }

    #[tokio::test]
    async fn an_attached_hold_is_kept_until_the_last_frame_is_taken() {
        use http_body_util::BodyExt;
        let m = memory(AnswerMemory::MIN_BYTES);
        let mut hold = m.hold(A, ANSWER_BYTES, 1).await;
        let answer = vec![7u8; FRAME * 2 + 5];
        hold.shrink_to(answer.len());
        let held = answer.len().div_ceil(UNIT) * UNIT;
        let resp = hold.attach(Response::new(Body::from(answer.clone())));
        assert_eq!(m.held_bytes(), held);
        let mut body = resp.into_body();
        assert_eq!(
            http_body::Body::size_hint(&body).exact(),
            Some(answer.len() as u64)
        );
        let mut sent = Vec::new();
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            let data = frame.expect("frame").into_data().expect("data");
            assert!(data.len() <= FRAME);
            sent.extend_from_slice(&data);
            frames += 1;
            if frames < 3 {
                assert_eq!(m.held_bytes(), held, "held while frames are left");
            }
        }
        assert_eq!((sent, frames), (answer, 3));
        drop(body);
        assert_eq!(m.held_bytes(), 0);
    }
}
