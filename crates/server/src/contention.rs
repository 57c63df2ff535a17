//! Which directories are shared right now (docs/protocol.md §4.1, "Shared directories").
//!
//! A directory taken whole (`Op::Acquire`) lets its holder answer changes in it itself;
//! every other session's change there then waits for the holder to flush and give it up.
//! Several sessions working in one directory at once would trade it back and forth, each
//! trade recalling every entry one of them took whole and holding everyone else's
//! changes until the holder has written back: with eight mounts creating in one big
//! directory, creates fell to a few a second. So a directory another session changed (or
//! took whole) within `window_ms` is *shared*, and an acquire of it is refused (EBUSY):
//! everyone changes it through the server, one round trip per change, until the others
//! have been quiet for the window, when the next acquire (a client retries at most once a
//! second) takes it whole again.
//!
//! Invariant (tests below): an acquire by S of D is refused exactly when some session
//! other than S used D within the window; memory holds only directories used within it.

use std::collections::{HashMap, VecDeque};

use crate::SessionId;

/// How recently another session must have changed a directory for it to count as
/// shared. One client retry period (crest-fuse's `ACQUIRE_RETRY`): two sessions at work in
/// one directory are seen by each other's every acquire.
pub const CONTENTION_MS: u64 = 1_000;

/// The last use of a directory, and the last one by anybody else.
#[derive(Debug, Clone, Copy)]
struct Users {
    last: (SessionId, u64),
    /// The latest use by a session other than `last`'s.
    other: Option<(SessionId, u64)>,
}

/// Recent users of directories (see the module's documentation).
#[derive(Debug)]
pub struct Contention {
    window_ms: u64,
    dirs: HashMap<u64, Users>,
    /// (time, directory) of uses, oldest first: what may have expired (amortised O(1)
    /// a use).
    order: VecDeque<(u64, u64)>,
}

impl Default for Contention {
    fn default() -> Self {
        Contention::new(CONTENTION_MS)
    }
}

impl Contention {
    /// A window of 0 never calls a directory shared.
    pub fn new(window_ms: u64) -> Contention {
        Contention { window_ms, dirs: HashMap::new(), order: VecDeque::new() }
    }

    /// `session` changed a name in `dir` (or took it whole) at `now_ms`.
    pub fn used(&mut self, dir: u64, session: SessionId, now_ms: u64) {
        if self.window_ms == 0 {
            return;
        }
        self.expire(now_ms);
        let fresh = match self.dirs.get_mut(&dir) {
            Some(u) if u.last.0 == session => {
                let newer = now_ms > u.last.1;
                u.last.1 = u.last.1.max(now_ms);
                newer
            }
            Some(u) => {
                u.other = Some(u.last);
                u.last = (session, now_ms);
                true
            }
            None => {
                self.dirs.insert(dir, Users { last: (session, now_ms), other: None });
                true
            }
        };
        if fresh {
            self.order.push_back((now_ms, dir));
        }
    }

    /// True when a session other than `session` used `dir` within the window before
    /// `now_ms`: `dir` is not to be handed to `session` whole.
    pub fn shared(&self, dir: u64, session: SessionId, now_ms: u64) -> bool {
        let recent = |(s, t): (SessionId, u64)| s != session && now_ms.saturating_sub(t) < self.window_ms;
        self.dirs.get(&dir).is_some_and(|u| recent(u.last) || u.other.is_some_and(recent))
    }

    /// Forgets `session`'s uses: a session that ended is nobody to trade a directory
    /// with (an unmount and a mount again within the window would otherwise work through
    /// the server one change at a time until the window passed). O(directories used
    /// within the window).
    pub fn forget_session(&mut self, session: SessionId) {
        self.dirs.retain(|_, u| {
            if u.other.is_some_and(|(s, _)| s == session) {
                u.other = None;
            }
            if u.last.0 == session {
                match u.other.take() {
                    Some(o) => u.last = o,
                    None => return false,
                }
            }
            true
        });
    }

    /// Forgets uses older than the window. Times come from the driver's clock, so one out
    /// of order only keeps those behind it a little longer.
    fn expire(&mut self, now_ms: u64) {
        while let Some(&(t, dir)) = self.order.front() {
            if now_ms.saturating_sub(t) < self.window_ms {
                break;
            }
            self.order.pop_front();
            if self.dirs.get(&dir).is_some_and(|u| u.last.1 <= t) {
                self.dirs.remove(&dir);
            }
        }
    }

    /// Directories remembered (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.dirs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_shared_while_another_session_used_it_within_the_window() {
        let mut c = Contention::new(1_000);
        c.used(10, 1, 5_000);
        assert!(!c.shared(10, 1, 5_100), "its only user may take it whole");
        assert!(c.shared(10, 2, 5_100), "another may not");
        assert!(!c.shared(11, 2, 5_100), "another directory is not shared");
        assert!(!c.shared(10, 2, 6_000), "a window after the last use it is free again");
        // Two at work: each sees the other, whoever came last.
        c.used(10, 2, 5_500);
        assert!(c.shared(10, 1, 5_600) && c.shared(10, 2, 5_600));
        c.used(10, 2, 6_400);
        assert!(c.shared(10, 1, 6_450), "1 sees 2's latest use");
        assert!(!c.shared(10, 2, 6_600), "2 no longer sees 1 (last used at 5 000)");
        c.used(10, 3, 6_700);
        assert!(c.shared(10, 2, 6_800) && c.shared(10, 1, 6_800));
        assert!(c.shared(10, 3, 6_800), "3 sees 2's use at 6 400");
        assert!(!c.shared(10, 3, 7_400), "and not a window later");
    }

    #[test]
    fn uses_older_than_the_window_are_forgotten() {
        let mut c = Contention::new(1_000);
        for i in 0..10_000u64 {
            c.used(i % 1_000, i % 7, i / 10);
        }
        assert!(c.len() <= 1_000);
        c.used(5, 1, 100_000);
        assert_eq!(c.len(), 1, "everything but the new use expired");
        assert!(c.order.len() <= 1);
        assert!(!c.shared(7, 2, 100_000));
    }

    #[test]
    fn a_forgotten_session_shares_nothing_and_the_others_still_count() {
        let mut c = Contention::new(1_000);
        c.used(10, 1, 100);
        c.used(10, 2, 200);
        c.used(11, 1, 300);
        c.forget_session(1);
        assert!(!c.shared(10, 2, 400), "2 is the only user left");
        assert!(c.shared(10, 3, 400), "2's use still counts for others");
        assert!(!c.shared(11, 2, 400) && c.len() == 1, "11 was 1's alone: gone");
        c.forget_session(2);
        assert_eq!(c.len(), 0);
        // What is left in the expiry queue goes without harm.
        c.used(12, 4, 5_000);
        assert_eq!((c.len(), c.order.len()), (1, 1));
    }

    #[test]
    fn a_window_of_zero_shares_nothing() {
        let mut c = Contention::new(0);
        c.used(10, 1, 5);
        assert!(!c.shared(10, 2, 5));
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn verdicts_match_a_plain_history_under_random_uses() {
        // Against the definition: some use of `dir` by another session in the last
        // window. Seeded; the seed is printed.
        let seed = std::env::var("CREST_CONTENTION_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64);
        println!("CREST_CONTENTION_SEED={seed}");
        let mut rng = crest_rng::Stream::from_seed_u64(seed);
        let window = 1 + rng.below(2_000);
        let mut c = Contention::new(window);
        let mut history: Vec<(u64, SessionId, u64)> = Vec::new();
        let mut now = 0u64;
        for _ in 0..20_000 {
            now += rng.below(50);
            let (dir, session) = (rng.below(8), rng.below(5));
            if rng.below(3) == 0 {
                let want = history.iter().any(|&(d, s, t)| d == dir && s != session && now - t < window);
                assert_eq!(c.shared(dir, session, now), want, "dir {dir} session {session} at {now}, window {window}");
            } else {
                c.used(dir, session, now);
                history.push((dir, session, now));
            }
        }
    }
}
