//! The round scheduling both simulated-cluster harnesses share (the
//! driver's, tests/common, and the BTL's, tests/btlsim): which ranks make
//! progress in a round, and where virtual time goes once all are idle.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use xrcbtl_fabric::sim::SimFabric;

/// Ranks by process, and the timers they asked for.
pub struct Sched {
    rank_of_pid: HashMap<u32, u32>,
    timers: BTreeSet<(Duration, u32)>,
    timer_of: HashMap<u32, Duration>,
}

impl Sched {
    /// Ranks are known by their process ids.
    pub fn new(rank_of_pid: HashMap<u32, u32>) -> Sched {
        Sched {
            rank_of_pid,
            timers: BTreeSet::new(),
            timer_of: HashMap::new(),
        }
    }

    /// The ranks to progress now: those the fabric queued something for,
    /// those in `marked`, and those whose timer is due at `now` (which it
    /// consumes).
    pub fn due(
        &mut self,
        sim: &SimFabric,
        now: Duration,
        marked: impl IntoIterator<Item = u32>,
    ) -> BTreeSet<u32> {
        let mut todo: BTreeSet<u32> = sim
            .take_touched()
            .iter()
            .filter_map(|pid| self.rank_of_pid.get(pid).copied())
            .collect();
        todo.extend(marked);
        while let Some(&(t, r)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            self.timer_of.remove(&r);
            todo.insert(r);
        }
        todo
    }

    /// Rank `r`'s next timer, replacing the one it had.
    pub fn set_timer(&mut self, r: u32, t: Option<Duration>) {
        if let Some(old) = self.timer_of.remove(&r) {
            self.timers.remove(&(old, r));
        }
        if let Some(t) = t {
            self.timers.insert((t, r));
            self.timer_of.insert(r, t);
        }
    }

    /// Everyone was idle at `now`: time moves to the next event or timer.
    /// `false` when nothing is scheduled anywhere (nothing can happen).
    pub fn idle(&self, sim: &SimFabric, now: Duration) -> bool {
        let timer = self.timers.first().map(|(t, _)| *t);
        let next = match (sim.next_event_at(), timer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(t) if t > now => sim.advance(t - now),
            Some(_) => {
                sim.step();
            }
            None => return false,
        }
        true
    }
}
