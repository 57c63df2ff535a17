//! What stands between the connections and the store task, both ways, so that one peer's
//! flood costs only itself.
//!
//! Inbound, each connection has a queue of its own, bounded in bytes (`MAX_QUEUED_BYTES`):
//! its reader waits for room before it reads more of its socket, so a flooding peer is
//! held back by TCP, not buffered. The store task serves the queues in turn, at most
//! `BURST` messages and about `QUANTUM` of its time from each per round (a queue that took
//! longer owes it and is passed over until the others had as much), so another session's
//! request, recall answer or goodbye waits behind at most a burst or one message of each
//! flood, never behind the whole of it, and costly requests buy no bigger share. A
//! connection's own messages stay in the order they arrived (the protocol relies on it:
//! an `Open` ahead of its `RecallDone`). Only queues with something to take are visited:
//! a queue lists itself (`Ready`) when a message comes, when its connection goes, and
//! when its writer catches up, so a thousand idle sessions cost a heartbeat nothing more
//! than one.
//!
//! Outbound, a connection's outbox counts the bytes queued for its writer; while they
//! exceed `MAX_OUTBOX_BYTES` (a peer that does not read its replies) its queue is not
//! served and its reader reads no more requests, so the replies it makes the server hold
//! stay bounded too (by `MAX_OUTBOX_BYTES` and one reply: the store task hands replies to
//! the outboxes after each message it applies). Nor is it served while
//! `MAX_WAITING_REQUESTS` of its requests are in the core unanswered (parked behind other
//! sessions' rights, held for the grace period), nor while the file data those requests
//! hold and may be answered with, added to its queued replies, exceeds
//! `MAX_OUTBOX_BYTES`: parked work is bounded as replies are, so a connection's parked
//! reads, released at once, cannot make the server hold more than its bound.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

/// Bytes of decoded messages one connection may have waiting for the store task.
pub const MAX_QUEUED_BYTES: usize = 4 << 20;
/// Bytes of replies and notices one connection's writer may have waiting to be sent
/// before its reader stops taking requests.
pub const MAX_OUTBOX_BYTES: usize = 16 << 20;
/// Messages taken from one connection's queue per round.
pub const BURST: usize = 16;
/// The store task's time one connection's queue is given per round. A queue that takes
/// longer (one message can: sixteen locks on a crowded file, an fsync) owes the difference and is
/// passed over, a `QUANTUM` of its debt paid each round, until the others had as much.
pub const QUANTUM: Duration = Duration::from_millis(2);
/// Most a queue can owe: what it used long ago is not held against it for ever.
pub const MAX_DEBT: Duration = Duration::from_secs(1);
/// Requests of one connection in the core and not answered yet (a client keeps at most
/// 1,024 in flight: `crest_net::MAX_IN_FLIGHT`).
pub const MAX_WAITING_REQUESTS: usize = 4096;

/// One message in a queue, holding its share of the queue's bytes until it is applied.
pub struct Queued<T> {
    pub item: T,
    _bytes: OwnedSemaphorePermit,
}

/// The store task is gone.
#[derive(Debug)]
pub struct Closed;

/// The queues that have something for the store task, in the order they asked, and the
/// store task's wake-up.
#[derive(Default)]
pub struct Ready {
    list: Mutex<VecDeque<u64>>,
    notify: Notify,
    ids: AtomicU64,
}

impl Ready {
    /// Wakes when a queue was listed (or `notify_one`) since the last wake.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// Wakes the store task.
    pub fn notify_one(&self) {
        self.notify.notify_one();
    }

    fn list(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One queue's place in `Ready`.
#[derive(Clone)]
pub struct Wake {
    id: u64,
    /// In `Ready`'s list (set by whoever lists it, cleared by the store task as it takes
    /// it): a queue is listed at most once at a time.
    listed: Arc<AtomicBool>,
    ready: Arc<Ready>,
}

impl Wake {
    /// Lists the queue, unless it is listed already, and wakes the store task.
    pub fn wake(&self) {
        if !self.listed.swap(true, Ordering::AcqRel) {
            self.ready.list().push_back(self.id);
        }
        self.ready.notify_one();
    }
}

/// A connection's end of its queue.
pub struct Inbox<T> {
    tx: mpsc::UnboundedSender<Queued<T>>,
    room: Arc<Semaphore>,
    wake: Wake,
}

impl<T> Drop for Inbox<T> {
    /// The store task learns the connection went (and drops its queue once empty).
    fn drop(&mut self) {
        self.wake.wake();
    }
}

impl<T> Inbox<T> {
    /// Queues `item`, which took `bytes` on the wire, once there is room for it (a message
    /// larger than the whole queue waits for it to be empty).
    pub async fn send(&self, item: T, bytes: usize) -> Result<(), Closed> {
        let bytes = bytes.clamp(1, MAX_QUEUED_BYTES) as u32;
        let permit = self.room.clone().acquire_many_owned(bytes).await.map_err(|_| Closed)?;
        self.tx.send(Queued { item, _bytes: permit }).map_err(|_| Closed)?;
        self.wake.wake();
        Ok(())
    }
}

/// The store task's end of a connection's queue (to `Queues::add` when the connection's
/// hello is applied).
pub struct Receiver<T> {
    rx: mpsc::UnboundedReceiver<Queued<T>>,
    wake: Wake,
}

/// A new connection's queue, listed in `ready` (`Queues::ready`) as messages come: its
/// end, the store task's, and its place in `ready` (for its `Backlog`).
pub fn queue<T>(ready: &Arc<Ready>) -> (Inbox<T>, Receiver<T>, Wake) {
    let (tx, rx) = mpsc::unbounded_channel();
    let wake = Wake { id: ready.ids.fetch_add(1, Ordering::Relaxed), listed: Arc::default(), ready: ready.clone() };
    (
        Inbox { tx, room: Arc::new(Semaphore::new(MAX_QUEUED_BYTES)), wake: wake.clone() },
        Receiver { rx, wake: wake.clone() },
        wake,
    )
}

/// One connection's queue, as the store task serves it.
struct Entry<T> {
    rx: mpsc::UnboundedReceiver<Queued<T>>,
    wake: Wake,
    /// Its connection's unsent replies: over `MAX_OUTBOX_BYTES`, the queue waits (unless
    /// the connection is gone: what it queued last, its disconnection, must be applied).
    backlog: Backlog,
    /// The store task's time it used beyond its shares (`QUANTUM`). A queue left empty
    /// owes nothing (as in deficit round robin): a session that waits for its answers
    /// between costly requests gets one a round like any other; only a queue that keeps
    /// more waiting carries a debt from round to round (run up alone and paid a share a
    /// round while many others are served, it would starve it for long).
    debt: Duration,
}

impl<T> Entry<T> {
    fn waits(&self) -> bool {
        self.backlog.full() && !self.rx.is_closed()
    }
}

/// The store task's end: every connection's queue, those listed served in turn.
pub struct Queues<T> {
    entries: HashMap<u64, Entry<T>>,
    ready: Arc<Ready>,
    /// Queues looked at so far (for tests: idle ones are not).
    visits: u64,
}

impl<T> Queues<T> {
    pub fn new() -> Queues<T> {
        Queues { entries: HashMap::new(), ready: Arc::default(), visits: 0 }
    }

    /// Where queues list themselves, and the store task's wake-up.
    pub fn ready(&self) -> Arc<Ready> {
        self.ready.clone()
    }

    /// Serves `q` from now on, while its connection's `backlog` allows.
    pub fn add(&mut self, q: Receiver<T>, backlog: Backlog) {
        let wake = q.wake.clone();
        self.entries.insert(q.wake.id, Entry { rx: q.rx, wake: q.wake, backlog, debt: Duration::ZERO });
        // Listed again, whether or not it was (what came before this was lost on a list
        // that had no entry for it yet; a second listing costs a look at an empty queue).
        wake.listed.store(false, Ordering::Release);
        wake.wake();
    }

    /// One round: each listed queue in turn (but for those waiting for their writer) is
    /// given `QUANTUM` of the store task's time, less what it owes, and its messages are
    /// given to `apply` (which returns false to stop at once) until that time is used —
    /// at least one and at most `BURST`. What it used beyond its share it owes; a queue
    /// owing a whole share or more is passed over, paying one share. So a peer whose
    /// requests cost much (a thousand locks, an fsync each) gets the store task's time as
    /// often as another, not as many messages. A queue with more is listed again behind
    /// the others; queues whose connection is gone and that are empty are dropped.
    /// Returns how many messages were applied, and whether `apply` asked to stop.
    pub fn round(&mut self, mut apply: impl FnMut(T) -> bool) -> (usize, bool) {
        let mut applied = 0;
        let listed = self.ready.list().len();
        self.forgive();
        for _ in 0..listed {
            let Some(id) = self.ready.list().pop_front() else { break };
            let Some(mut e) = self.entries.remove(&id) else { continue };
            self.visits += 1;
            // From here a message, a goodbye or a writer catching up lists it again. (A
            // swap, not a store: ordered before the `try_recv`s below, so a sender that
            // saw it listed has its message seen by them, on any number of threads.)
            e.wake.listed.swap(false, Ordering::AcqRel);
            if e.debt >= QUANTUM {
                e.debt -= QUANTUM;
                e.wake.wake();
                self.entries.insert(id, e);
                continue;
            }
            let share = QUANTUM.saturating_sub(e.debt);
            let start = Instant::now();
            let (mut open, mut more) = (true, false);
            for taken in 1..=BURST {
                if e.waits() {
                    break;
                }
                match e.rx.try_recv() {
                    Ok(q) => {
                        applied += 1;
                        if !apply(q.item) {
                            if !e.wake.listed.swap(true, Ordering::AcqRel) {
                                self.ready.list().push_front(id);
                            }
                            self.entries.insert(id, e);
                            return (applied, true);
                        }
                        more = taken == BURST || start.elapsed() >= share;
                        if more {
                            break;
                        }
                    }
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            e.debt = if e.rx.is_empty() { Duration::ZERO } else { start.elapsed().saturating_sub(share).min(MAX_DEBT) };
            if open {
                if more && !e.waits() {
                    e.wake.wake();
                }
                self.entries.insert(id, e);
            }
        }
        (applied, false)
    }

    /// When every listed queue that can be served owes a share or more, what the least of
    /// them owes is forgiven all of them: the store task does not stand idle while work
    /// waits, and what they owe one another stays.
    fn forgive(&mut self) {
        let list = self.ready.list();
        let owing = list.iter().filter_map(|id| self.entries.get(id)).filter(|e| !e.waits()).map(|e| e.debt);
        let Some(least) = owing.min().filter(|&d| d >= QUANTUM) else { return };
        for id in list.iter() {
            if let Some(e) = self.entries.get_mut(id) {
                e.debt = e.debt.saturating_sub(least);
            }
        }
    }

    /// Applies everything queued, queue by queue in turn, until every queue is empty.
    pub fn drain(&mut self, mut apply: impl FnMut(T) -> bool) -> bool {
        loop {
            match self.round(&mut apply) {
                (_, true) => return true,
                (0, false) => return false,
                _ => {}
            }
        }
    }
}

/// What a connection has waiting on the way out: bytes queued for its writer (counted up
/// by the store task as it queues a message, down by the writer once it has written it),
/// and requests handed to the core and not answered yet, with the bytes their answers
/// may take (`promised`).
#[derive(Clone)]
pub struct Backlog {
    bytes: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    promised: Arc<Mutex<Promised>>,
    drained: Arc<Notify>,
    /// Its connection's queue's place in `Ready`: a queue that waited may go on.
    wake: Wake,
}

/// The answers a connection's requests in the core may take: the bytes their reads ask
/// for, by request id. A request parked behind another session's rights is unanswered
/// for as long as that session takes; counted as if its answer were queued already, a
/// connection's parked reads, released together, make the server hold no more than the
/// bound of its replies (`MAX_OUTBOX_BYTES` and one request's).
#[derive(Default)]
struct Promised {
    total: usize,
    by_id: HashMap<u64, usize>,
}

impl Backlog {
    pub fn new(wake: &Wake) -> Backlog {
        Backlog {
            bytes: Arc::default(),
            requests: Arc::default(),
            promised: Arc::default(),
            drained: Arc::default(),
            wake: wake.clone(),
        }
    }

    /// Too much waits: the connection's queue is not served.
    pub fn full(&self) -> bool {
        self.bytes().saturating_add(self.promised()) > MAX_OUTBOX_BYTES
            || self.requests.load(Ordering::Relaxed) >= MAX_WAITING_REQUESTS
    }

    /// Bytes the answers of its requests in the core may take.
    pub fn promised(&self) -> usize {
        self.promised.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Request `id`, whose answer may take `promise` bytes, was handed to the core.
    pub fn asked(&self, id: u64, promise: usize) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if promise > 0 {
            let mut p = self.promised.lock().unwrap_or_else(|e| e.into_inner());
            p.total = p.total.saturating_add(promise);
            // (One id twice in the core at once — only a peer breaking the protocol sends
            // that — is let go of at the first answer: it costs that peer, as it should.)
            *p.by_id.entry(id).or_default() += promise;
        }
    }

    /// The response to request `id` was queued for the writer.
    pub fn answered(&self, id: u64) {
        let was_full = self.full();
        let _ = self.requests.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
        {
            let mut p = self.promised.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(promise) = p.by_id.remove(&id) {
                p.total = p.total.saturating_sub(promise);
            }
        }
        if was_full && !self.full() {
            self.wake.wake();
        }
    }

    pub fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn sent(&self, bytes: usize) {
        let was_full = self.full();
        // (Never below zero: what is subtracted was added first.)
        let _ = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(bytes)));
        self.drained.notify_one();
        if was_full && !self.full() {
            self.wake.wake();
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Waits until at most `MAX_OUTBOX_BYTES` are queued.
    pub async fn room(&self) {
        while self.bytes() > MAX_OUTBOX_BYTES {
            self.drained.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new connection's queue, served by `q`: its inbox, and its outbox's backlog.
    fn served<T>(q: &mut Queues<T>) -> (Inbox<T>, Backlog) {
        let (inbox, rx, wake) = queue(&q.ready());
        let backlog = Backlog::new(&wake);
        q.add(rx, backlog.clone());
        (inbox, backlog)
    }

    /// What `q.drain` applies, in order, added to `got`.
    fn drain_into<T>(q: &mut Queues<T>, got: &mut Vec<T>) -> bool {
        q.drain(|x| {
            got.push(x);
            true
        })
    }

    /// Polls `f` once: `Some` if it is ready.
    fn poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::Pin::new(&mut f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_flood_in_one_queue_delays_another_by_at_most_a_burst() {
        let mut q = Queues::new();
        let (flood, _) = served(&mut q);
        let (quiet, _) = served(&mut q);
        for i in 0..1000u32 {
            flood.send(i, 1).await.expect("queued");
        }
        quiet.send(5000, 1).await.expect("queued");
        let mut order = Vec::new();
        drain_into(&mut q, &mut order);
        assert_eq!(order.len(), 1001);
        let at = order.iter().position(|&x| x == 5000).expect("applied");
        assert!(at <= BURST, "the quiet queue's message came after {at} of the flood's");
        let flood_order: Vec<u32> = order.iter().copied().filter(|&x| x != 5000).collect();
        assert_eq!(flood_order, (0..1000).collect::<Vec<_>>(), "one queue's messages stay in order");
    }

    #[tokio::test]
    async fn a_queue_whose_messages_cost_much_gets_the_store_task_no_longer_than_another() {
        let mut q = Queues::new();
        let (costly, _) = served(&mut q);
        let (cheap, _) = served(&mut q);
        for i in 0..20u32 {
            costly.send(i, 1).await.expect("queued");
        }
        for i in 0..200u32 {
            cheap.send(1000 + i, 1).await.expect("queued");
        }
        let mut order = Vec::new();
        // A costly message takes 25 quanta at least (a sleep never ends early); the cheap
        // ones take microseconds, a burst per round.
        drain_into_costing(&mut q, &mut order, |&x| if x < 1000 { QUANTUM * 25 } else { Duration::ZERO });
        assert_eq!(order.len(), 220, "every message applied: the store task does not idle while work waits");
        let last_cheap = order.iter().rposition(|&x| x >= 1000).expect("cheap ones applied");
        let costly_first = order[..last_cheap].iter().filter(|&&x| x < 1000).count();
        // As many messages a round, the costly queue would have had all 20 in by then.
        assert!(costly_first <= 3, "{costly_first} costly messages before the cheap queue's 200: {order:?}");
        for range in [0..1000, 1000..2000] {
            let one: Vec<u32> = order.iter().copied().filter(|x| range.contains(x)).collect();
            assert!(one.windows(2).all(|w| w[0] < w[1]), "one queue's messages stay in order");
        }
    }

    /// `drain_into`, each message taking the time `cost` says.
    fn drain_into_costing<T>(q: &mut Queues<T>, got: &mut Vec<T>, cost: impl Fn(&T) -> Duration) {
        q.drain(|x| {
            std::thread::sleep(cost(&x));
            got.push(x);
            true
        });
    }

    #[tokio::test]
    async fn a_message_costs_a_look_at_its_own_queue_not_at_every_idle_one() {
        let mut q = Queues::new();
        let idle: Vec<_> = (0..10_000).map(|_| served(&mut q)).collect();
        drain_into(&mut q, &mut Vec::new());
        for (i, at) in [7_000, 3, 9_999].into_iter().enumerate() {
            let before = q.visits;
            idle[at].0.send(at as u32, 1).await.expect("queued");
            let mut got = Vec::new();
            drain_into(&mut q, &mut got);
            assert_eq!(got, vec![at as u32], "message {i}");
            assert_eq!(q.visits - before, 1, "message {i}: queues looked at");
        }
    }

    #[tokio::test]
    async fn what_is_queued_before_its_queue_is_served_is_applied_once_it_is() {
        let mut q = Queues::new();
        let (inbox, rx, wake) = queue(&q.ready());
        inbox.send(9u32, 1).await.expect("queued");
        assert_eq!(q.round(|_| true), (0, false), "not served yet");
        q.add(rx, Backlog::new(&wake));
        let mut got = Vec::new();
        drain_into(&mut q, &mut got);
        assert_eq!(got, vec![9], "applied once served, before anything else comes");
        inbox.send(10, 1).await.expect("queued");
        drain_into(&mut q, &mut got);
        assert_eq!(got, vec![9, 10]);
    }

    #[tokio::test]
    async fn a_full_queue_makes_its_sender_wait_until_its_messages_are_applied() {
        let mut q = Queues::new();
        let (inbox, _) = served(&mut q);
        inbox.send(1u32, MAX_QUEUED_BYTES / 2).await.expect("queued");
        inbox.send(2, MAX_QUEUED_BYTES / 2).await.expect("queued");
        let third = inbox.send(3, 10);
        tokio::pin!(third);
        assert!(poll_once(third.as_mut()).is_none(), "no room for a third");
        let (n, _) = q.round(|_| true);
        assert_eq!(n, 2);
        assert!(poll_once(third.as_mut()).is_some(), "room once they are applied");
        let mut got = Vec::new();
        drain_into(&mut q, &mut got);
        assert_eq!(got, vec![3]);
    }

    #[tokio::test]
    async fn a_queue_whose_connection_is_gone_is_dropped_once_empty() {
        let mut q = Queues::new();
        let (inbox, backlog) = served(&mut q);
        backlog.add(MAX_OUTBOX_BYTES + 1);
        inbox.send(7u32, 1).await.expect("queued");
        drop(inbox);
        let mut got = Vec::new();
        assert!(!drain_into(&mut q, &mut got));
        assert_eq!(got, vec![7], "what it queued before it went is applied, its writer behind or not");
        assert!(q.entries.is_empty());
    }

    #[tokio::test]
    async fn a_reader_waits_while_its_writer_is_behind() {
        let ready = Arc::new(Ready::default());
        let (_inbox, _rx, wake) = queue::<u32>(&ready);
        let b = Backlog::new(&wake);
        b.add(MAX_OUTBOX_BYTES + 1);
        let room = b.room();
        tokio::pin!(room);
        assert!(poll_once(room.as_mut()).is_none());
        b.sent(2);
        assert!(poll_once(room.as_mut()).is_some());
        assert!(poll_once(Box::pin(ready.notified())).is_some(), "the store task is woken");
        b.sent(usize::MAX);
        assert_eq!(b.bytes(), 0);
    }

    #[tokio::test]
    async fn a_queue_whose_writer_is_behind_waits_and_others_go_on() {
        let mut q = Queues::new();
        let (slow, backlog) = served(&mut q);
        let (other, _) = served(&mut q);
        for i in 0..5u32 {
            slow.send(i, 1).await.expect("queued");
        }
        other.send(100, 1).await.expect("queued");
        let mut got = Vec::new();
        // Its replies pile up after the second message it is served.
        q.drain(|x| {
            got.push(x);
            if x == 1 {
                backlog.add(MAX_OUTBOX_BYTES + 1);
            }
            true
        });
        assert_eq!(got, vec![0, 1, 100], "the slow queue waits after the message that filled its outbox");
        backlog.sent(MAX_OUTBOX_BYTES);
        drain_into(&mut q, &mut got);
        assert_eq!(got, vec![0, 1, 100, 2, 3, 4], "and goes on once its writer caught up");
    }

    #[tokio::test]
    async fn a_queue_with_too_many_requests_unanswered_waits_for_answers() {
        let mut q = Queues::new();
        let (inbox, backlog) = served(&mut q);
        let n = MAX_WAITING_REQUESTS + 10;
        for i in 0..n {
            inbox.send(i, 1).await.expect("queued");
        }
        // Each request applied goes into the core, unanswered.
        let into_core = |q: &mut Queues<usize>| {
            let mut got = Vec::new();
            q.drain(|x| {
                backlog.asked(x as u64, 0);
                got.push(x);
                true
            });
            got.len()
        };
        let first = into_core(&mut q);
        assert_eq!(first, MAX_WAITING_REQUESTS, "no more requests than the bound go into the core unanswered");
        for id in 0..3 {
            backlog.answered(id);
        }
        assert!(poll_once(Box::pin(q.ready().notified())).is_some(), "an answer at the bound wakes the store task");
        assert_eq!(first + into_core(&mut q), MAX_WAITING_REQUESTS + 3, "each answer lets one more in");
    }

    #[tokio::test]
    async fn requests_whose_answers_may_fill_the_outbox_wait_outside_the_core() {
        let mut q = Queues::new();
        let (inbox, backlog) = served(&mut q);
        // Reads of sizes around the bound's fractions, from a printed seed.
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        println!("seed {seed}");
        let mut rng = seed | 1;
        let sizes: Vec<usize> = (0..200)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                1 + (rng % (4 << 20)) as usize
            })
            .collect();
        for i in 0..sizes.len() {
            inbox.send(i, 1).await.expect("queued");
        }
        let mut in_core: Vec<usize> = Vec::new();
        let into_core = |q: &mut Queues<usize>, in_core: &mut Vec<usize>| {
            q.drain(|x| {
                backlog.asked(x as u64, sizes[x]);
                in_core.push(x);
                true
            });
        };
        into_core(&mut q, &mut in_core);
        let promised: usize = in_core.iter().map(|&x| sizes[x]).sum();
        let last = sizes[*in_core.last().expect("some went in")];
        assert!(promised - last <= MAX_OUTBOX_BYTES, "{promised} bytes promised before the last went in");
        assert!(in_core.len() < sizes.len(), "the rest wait outside the core");
        assert_eq!(backlog.promised(), promised);
        // Answered (the data now queued for the writer), the promise becomes bytes; sent,
        // room again.
        for &x in &in_core {
            backlog.add(sizes[x]);
            backlog.answered(x as u64);
        }
        assert_eq!(backlog.promised(), 0);
        let before = in_core.len();
        into_core(&mut q, &mut in_core);
        assert_eq!(in_core.len(), before, "answers not yet sent still count");
        backlog.sent(promised);
        into_core(&mut q, &mut in_core);
        assert!(in_core.len() > before, "sent, the next go in");
    }
}
