//! The project's lock scripts, put together from their `.lua` files as
//! `lock-runtime/src/backend/scripts.rs` puts them together (the files are
//! read unchanged; only the list of parts is repeated here).

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("../../../lock-runtime/src/backend/lua/", $file))
    };
}

const SHEBANG: &str = "#!lua flags=allow-cross-slot-keys\n";

/// A script: its name (as scripts.rs names it) and source.
pub struct Script {
    pub name: &'static str,
    pub source: String,
}

fn script(name: &'static str, parts: &[&str]) -> Script {
    Script {
        name,
        source: parts.concat(),
    }
}

/// Every script of the project.
pub fn all() -> Vec<Script> {
    let publish = lua!("publish.lua");
    let mark = lua!("mark.lua");
    let prune = lua!("prune.lua");
    let tickets = lua!("tickets.lua");
    let quorum_shared = lua!("quorum_shared.lua");
    let shares = lua!("shares.lua");
    let rw_state = lua!("rw_state.lua");
    let semaphore = lua!("semaphore.lua");
    let any_slot = lua!("any_slot.lua");
    vec![
        script("acquire", &[publish, mark, prune, lua!("acquire.lua")]),
        script("acquire_all", &[prune, lua!("acquire_all.lua")]),
        script(
            "release",
            &[lua!("release.lua"), publish, lua!("release_wake.lua")],
        ),
        script(
            "quorum_acquire",
            &[publish, tickets, lua!("quorum_acquire.lua")],
        ),
        script(
            "quorum_release",
            &[
                lua!("quorum_release.lua"),
                publish,
                tickets,
                lua!("quorum_release_wake.lua"),
            ],
        ),
        script(
            "quorum_leave",
            &[publish, tickets, lua!("quorum_leave.lua")],
        ),
        script(
            "quorum_rw_acquire",
            &[
                publish,
                tickets,
                quorum_shared,
                lua!("quorum_rw_acquire.lua"),
            ],
        ),
        script(
            "quorum_semaphore_acquire",
            &[
                publish,
                tickets,
                quorum_shared,
                lua!("quorum_semaphore_acquire.lua"),
            ],
        ),
        script(
            "quorum_shared_release",
            &[
                publish,
                tickets,
                quorum_shared,
                lua!("quorum_shared_release.lua"),
            ],
        ),
        script(
            "quorum_shared_leave",
            &[
                publish,
                tickets,
                quorum_shared,
                lua!("quorum_shared_leave.lua"),
            ],
        ),
        script("release_keeping", &[lua!("release_keeping.lua")]),
        script("leave", &[publish, mark, prune, lua!("leave.lua")]),
        script("renew", &[lua!("renew.lua")]),
        script("renew_any_slot", &[SHEBANG, any_slot, lua!("renew.lua")]),
        script("fence_raise", &[lua!("fence_raise.lua")]),
        script("handoff", &[lua!("handoff.lua")]),
        script(
            "rw_acquire",
            &[publish, shares, rw_state, lua!("rw_acquire.lua")],
        ),
        script(
            "rw_release",
            &[publish, shares, rw_state, lua!("rw_release.lua")],
        ),
        script(
            "rw_leave",
            &[publish, shares, rw_state, lua!("rw_leave.lua")],
        ),
        script(
            "semaphore_acquire",
            &[publish, shares, semaphore, lua!("semaphore_acquire.lua")],
        ),
        script(
            "semaphore_release",
            &[publish, shares, semaphore, lua!("semaphore_release.lua")],
        ),
        script(
            "semaphore_leave",
            &[publish, shares, semaphore, lua!("semaphore_leave.lua")],
        ),
        script(
            "renew_shares_any_slot",
            &[SHEBANG, any_slot, publish, shares, lua!("renew_shares.lua")],
        ),
        script("renew_shares", &[publish, shares, lua!("renew_shares.lua")]),
        script("inspect", &[lua!("inspect.lua")]),
        script("record", &[lua!("record.lua")]),
    ]
}
