//! What a running server takes again without a restart (`Serving::reload`; `crest serve`
//! calls it on SIGHUP): the most sessions one client identity may hold, and the export
//! policies of the sessions already connected. Those are read again from
//! `exports.json`; a session whose policy is no longer what it got at its hello has its
//! connection closed — its client connects again at once (the session stays), and that
//! hello takes the policy as it is now, with the identity map its mount judges by.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crest_server::authz::Policy;
use crest_tls::Fingerprint;
use tokio::sync::watch;

use crate::{Ctrl, Gate, Serving};

/// What to change.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reload {
    /// The most sessions (and connections) one client identity may hold; `None` keeps it.
    pub sessions_per_identity: Option<usize>,
}

impl Serving {
    /// Applies `r`, and has every connected session's export policy read again. `Err`
    /// says why the export policies file as it is now was refused: the policies before it
    /// stay in force (the rest of `r` is applied all the same).
    pub fn reload(&self, r: Reload) -> Result<(), String> {
        if let Some(n) = r.sessions_per_identity {
            self.per_identity.store(n, Ordering::Relaxed);
            let _ = self.cmds.send(Ctrl::SessionsPerIdentity(n));
        }
        let read = self.exports.as_ref().map_or(Ok(()), |e| e.reread());
        self.policies.send_modify(|generation| *generation += 1);
        read
    }
}

/// The news of revocations, as each connection holds it.
pub(crate) type Revocations = watch::Receiver<Arc<HashSet<Fingerprint>>>;

/// What a connection watches besides its bytes: its certificate's revocation, and a
/// reload that changes its export policy.
pub(crate) struct Watched {
    pub(crate) revoked: Option<(Fingerprint, Revocations)>,
    pub(crate) policy: Option<PolicyWatch>,
}

pub(crate) struct PolicyWatch {
    gate: Arc<Gate>,
    name: String,
    local: bool,
    /// What its hello got.
    current: Policy,
    reloads: watch::Receiver<u64>,
}

impl Watched {
    /// For a session admitted as `(fingerprint, revocations, name, local)` through `gate`
    /// with `current` as its policy (nothing to watch for `--insecure`).
    pub(crate) fn new(
        admitted: Option<(Fingerprint, Revocations, String, bool)>,
        gate: Option<Arc<Gate>>,
        current: Policy,
    ) -> Watched {
        let Some((fingerprint, revoked, name, local)) = admitted else {
            return Watched { revoked: None, policy: None };
        };
        let policy = gate.map(|gate| {
            let mut reloads = gate.policies.clone();
            reloads.borrow_and_update();
            PolicyWatch { gate, name, local, current, reloads }
        });
        Watched { revoked: Some((fingerprint, revoked)), policy }
    }
}

/// Returns once a reload gives the session `watch` watches another policy (never without
/// one).
pub(crate) async fn policy_changed(watch: &mut Option<PolicyWatch>) {
    let Some(w) = watch else { return std::future::pending().await };
    loop {
        if w.reloads.changed().await.is_err() {
            return std::future::pending().await;
        }
        if w.gate.exports.policy_for(&w.name, w.local) != w.current {
            return;
        }
    }
}
