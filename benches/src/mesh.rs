//! The fault mesh: every rank sends to every other rank for a while, with
//! checked payloads, a window per peer and a closing handshake, so that a
//! rank killed or stopped from outside (SIGKILL, SIGSTOP) shows what the
//! survivors saw: when they heard of the failure, whether they went on
//! talking to everyone else, and whether any message was lost, doubled,
//! reordered or corrupted.
//!
//! One [`Mesh`] is one rank's side. It is driven by [`Mesh::step`] from
//! the rank's own loop (the `xrcbtl_mesh` program on verbs, one process
//! per rank; the tests on the simulated fabric, every rank in one
//! process), and ends with a [`MeshReport`] that [`MeshReport::check`]
//! holds against what was done to the ranks.
//!
//! The traffic lasts until the driver ends it ([`Mesh::end_traffic`]), or
//! at most [`MeshOptions::traffic`]: a harness that does something to the
//! ranks ends the traffic only once it has seen the outcome it waits for,
//! so its fault lands while the traffic flows however slowly the machine
//! runs. Two lines on stderr tell it what it waits for: `heard from every
//! live peer since the failure` once a payload from each live peer has
//! arrived after the first failure this rank heard of, and `heard from
//! every live peer since mark N` likewise after [`Mesh::mark`].
//!
//! The protocol, per ordered pair of ranks:
//! - `DATA` messages numbered from 0, of the sizes of
//!   [`MeshOptions::sizes`] in turn, each filled with a pattern of its
//!   source and number; the receiver checks the number, the size and
//!   every byte;
//! - an `ACK` back every quarter window, with the count received: a
//!   sender keeps at most [`MeshOptions::window`] messages unacknowledged,
//!   so a stopped peer holds back its senders instead of filling their
//!   memory;
//! - after the traffic, `DONE` with the count sent, answered by `FIN`. A
//!   rank leaves once it has `DONE` (and all the data it announces) and
//!   `FIN` from every peer still alive: the last message of a pair is one
//!   its receiver waits for, so a clean exit loses nothing.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use xrcbtl_btl::{Btl, Bytes, Incoming, Tag};

/// A rank number.
type Rank = u32;
use xrcbtl_fabric::Context;

/// Tag of the mesh's payloads.
pub const DATA: Tag = 11;
/// Tag of acknowledgements (count received, u64 little endian).
pub const ACK: Tag = 12;
/// Tag of the closing message (count sent, u64 little endian).
pub const DONE: Tag = 13;
/// Tag of the answer to `DONE`.
pub const FIN: Tag = 14;

/// Bytes of a payload's own header: its number (u64) and source (u32,
/// with [`AFTER_FAILURE`] set in a payload sent after its sender heard of
/// a failure).
const STAMP: usize = 12;

/// The flag of the source word of a payload whose sender had heard of a
/// failure when it sent it.
const AFTER_FAILURE: u32 = 1 << 31;

/// How a mesh rank runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshOptions {
    /// How long to send at most once every peer has been heard from (or
    /// failed); [`Mesh::end_traffic`] ends the traffic sooner.
    pub traffic: Duration,
    /// Most unacknowledged messages to one peer.
    pub window: u64,
    /// Payload sizes, used in turn (each at least 12 bytes).
    pub sizes: Vec<usize>,
    /// How long the closing handshake may take before the rank gives up
    /// on the peers that did not answer.
    pub close_within: Duration,
    /// How long to wait for every peer to be heard from at the start.
    pub start_within: Duration,
    /// Stop sending payloads at the first failure heard of: a broken rank,
    /// for showing that [`MeshReport::check`] and a harness find it.
    pub silent_after_failure: bool,
}

impl Default for MeshOptions {
    fn default() -> Self {
        MeshOptions {
            traffic: Duration::from_secs(10),
            window: 64,
            sizes: vec![64, 4096, 200, 65536],
            close_within: Duration::from_secs(60),
            start_within: Duration::from_secs(60),
            silent_after_failure: false,
        }
    }
}

/// What a rank knows of one peer.
#[derive(Debug, Clone, Default)]
pub struct PeerLog {
    /// Payloads sent to it.
    pub sent: u64,
    /// Payloads received from it intact: every number below this one.
    pub received: u64,
    /// Payloads received from it intact, in all.
    pub arrived: u64,
    /// Numbers received above `received`.
    pub ahead: std::collections::BTreeSet<u64>,
    /// Its latest count of our payloads received.
    pub acked: u64,
    /// Payloads it said it sent (its `DONE`).
    pub announced: Option<u64>,
    /// Whether its `FIN` came.
    pub fin: bool,
    /// When the BTL reported it failed (the rank's clock, from the start
    /// of the run; the wall clock, seconds since the epoch), and why.
    pub failed: Option<(Duration, f64, String)>,
    /// Payloads received from it that it sent after it heard of a failure
    /// (of any peer), once this rank had heard of one too: not those
    /// that were only in flight when the failure came.
    pub after_failure: u64,
    /// Payloads received from it since the latest [`Mesh::mark`].
    pub after_mark: u64,
    /// The first payload from it that was wrong.
    pub corrupt: Option<String>,
}

impl PeerLog {
    fn live(&self) -> bool {
        self.failed.is_none()
    }

    fn closed(&self) -> bool {
        !self.live() || (self.fin && self.announced.is_some_and(|n| n <= self.received))
    }
}

struct State {
    peers: Vec<PeerLog>,
    start: Duration,
    first_failure: Option<Duration>,
    window: u64,
    sizes: Vec<usize>,
}

impl State {
    /// Whether every live peer but `me` has sent a payload that `count`
    /// counts.
    fn heard_all(&self, me: Rank, count: impl Fn(&PeerLog) -> u64) -> bool {
        self.peers
            .iter()
            .enumerate()
            .all(|(r, p)| r as Rank == me || !p.live() || count(p) > 0)
    }
}

/// A moment of the run that a harness waits on: the rank prints a line
/// once it has heard from every live peer since then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Since {
    /// The first failure this rank heard of.
    Failure,
    /// The `n`th [`Mesh::mark`].
    Mark(u32),
}

/// One rank of the fault mesh.
pub struct Mesh<C: Context> {
    btl: Arc<Btl<C>>,
    me: Rank,
    size: u32,
    opts: MeshOptions,
    state: Arc<Mutex<State>>,
    start: Duration,
    traffic_until: Option<Duration>,
    closing_since: Option<Duration>,
    /// The moments whose line is still to be printed.
    awaited: Vec<Since>,
    marks: u32,
    report_every: Option<Duration>,
    next_report: Duration,
    next_refused_look: Duration,
}

/// The fill byte at `i` of payload `seq` from `src`.
fn pattern(src: Rank, seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_mul(31) ^ (src as u8).wrapping_mul(7) ^ (i as u8)
}

/// Payload `seq` from `src`, of `len` bytes; `after_failure` if `src` had
/// heard of a failure.
fn payload(src: Rank, seq: u64, len: usize, after_failure: bool) -> Bytes {
    let mut v = vec![0u8; len.max(STAMP)];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    let word = if after_failure {
        src | AFTER_FAILURE
    } else {
        src
    };
    v[8..STAMP].copy_from_slice(&word.to_le_bytes());
    for (i, b) in v.iter_mut().enumerate().skip(STAMP) {
        *b = pattern(src, seq, i);
    }
    Bytes::from(v)
}

/// What is wrong with a payload from `src` expected to be number `seq`
/// of `len` bytes, if anything.
fn check_payload(src: Rank, seq: u64, len: usize, data: &[u8]) -> Option<String> {
    if data.len() < STAMP {
        return Some(format!("a payload of {} bytes from rank {src}", data.len()));
    }
    if data.len() != len.max(STAMP) {
        return Some(format!(
            "payload {seq} from rank {src}: {} bytes, expected {}",
            data.len(),
            len.max(STAMP)
        ));
    }
    let got = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let from = u32::from_le_bytes(data[8..STAMP].try_into().expect("4 bytes")) & !AFTER_FAILURE;
    if got != seq || from != src {
        return Some(format!(
            "expected payload {seq} from rank {src}, got {got} stamped by rank {from}"
        ));
    }
    data.iter()
        .enumerate()
        .skip(STAMP)
        .find(|&(i, &b)| b != pattern(src, seq, i))
        .map(|(i, b)| format!("payload {seq} from rank {src}: byte {i} is {b:#x}"))
}

fn count(data: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(..8)?.try_into().ok()?))
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl<C: Context> Mesh<C> {
    /// Sets up this rank's side over `btl`, whose `size` peers (this rank
    /// among them) are added: registers the mesh's tags and the error
    /// callback.
    pub fn new(btl: Arc<Btl<C>>, size: u32, opts: MeshOptions) -> Self {
        assert!(
            !opts.sizes.is_empty() && opts.window >= 4,
            "mesh options: {opts:?}"
        );
        let me = btl.rank();
        let start = btl.config().clock.now();
        let state = Arc::new(Mutex::new(State {
            peers: vec![PeerLog::default(); size as usize],
            start,
            first_failure: None,
            window: opts.window,
            sizes: opts.sizes.clone(),
        }));
        let s = state.clone();
        btl.register_am(DATA, move |btl, m| Self::on_data(&s, btl, m));
        let s = state.clone();
        btl.register_am(ACK, move |_, m| {
            if let Some(n) = count(m.data) {
                let mut st = lock(&s);
                let p = &mut st.peers[m.src as usize];
                p.acked = p.acked.max(n);
            }
        });
        let s = state.clone();
        btl.register_am(DONE, move |btl, m| {
            let mut st = lock(&s);
            st.peers[m.src as usize].announced = count(m.data);
            drop(st);
            // The answer: the last message of the pair in this direction.
            let _ = btl.send(m.src, FIN, &[], &[]);
        });
        let s = state.clone();
        btl.register_am(FIN, move |_, m| lock(&s).peers[m.src as usize].fin = true);
        let s = state.clone();
        btl.register_error(move |btl, rank, e| {
            let mut st = lock(&s);
            let at = btl.config().clock.now().saturating_sub(st.start);
            let wall = epoch_now();
            eprintln!(
                "mesh: rank {me}: rank {rank} failed {:.3} s into the run (at {wall:.3}): {e}",
                at.as_secs_f64()
            );
            st.first_failure.get_or_insert(at);
            if let Some(p) = st.peers.get_mut(rank as usize) {
                p.failed.get_or_insert((at, wall, e.to_string()));
            }
        });
        Mesh {
            btl,
            me,
            size,
            opts,
            state,
            start,
            traffic_until: None,
            closing_since: None,
            awaited: vec![Since::Failure],
            marks: 0,
            report_every: None,
            next_report: start,
            next_refused_look: start,
        }
    }

    /// Prints a line of counts on stderr this often (on the rank's clock).
    pub fn report_every(mut self, every: Duration) -> Self {
        self.report_every = Some(every);
        self
    }

    fn on_data(state: &Mutex<State>, btl: &Btl<C>, m: &Incoming<'_>) {
        let mut st = lock(state);
        let failed_before = st.first_failure.is_some();
        let window = st.window;
        let Some(seq) = count(m.data) else {
            st.peers[m.src as usize].corrupt = Some(format!(
                "a payload of {} bytes from rank {}",
                m.data.len(),
                m.src
            ));
            return;
        };
        let len = st.sizes[(seq % st.sizes.len() as u64) as usize];
        let p = &mut st.peers[m.src as usize];
        if p.corrupt.is_some() {
            return;
        }
        if let Some(wrong) = check_payload(m.src, seq, len, m.data) {
            p.corrupt = Some(wrong);
            return;
        }
        // A rendezvous payload is delivered when its data has landed, so a
        // shorter one sent after it may come first: order is not checked,
        // only that each number comes once.
        if seq < p.received || !p.ahead.insert(seq) {
            p.corrupt = Some(format!("payload {seq} from rank {} came twice", m.src));
            return;
        }
        while p.ahead.remove(&p.received) {
            p.received += 1;
        }
        let word = u32::from_le_bytes(m.data[8..STAMP].try_into().expect("checked"));
        if failed_before && word & AFTER_FAILURE != 0 {
            p.after_failure += 1;
        }
        p.after_mark += 1;
        p.arrived += 1;
        let n = p.arrived;
        drop(st);
        if n % (window / 4) == 0 {
            let _ = btl.send(m.src, ACK, &[], &n.to_le_bytes());
        }
    }

    /// The peers' logs so far.
    pub fn logs(&self) -> Vec<PeerLog> {
        lock(&self.state).peers.clone()
    }

    /// Ends the traffic: the next [`Mesh::step`] starts the close (at
    /// once, if the traffic has not started yet).
    pub fn end_traffic(&mut self) {
        let now = self.btl.config().clock.now();
        self.traffic_until = Some(self.traffic_until.map_or(now, |until| until.min(now)));
    }

    /// Marks a moment of the run (the harness resumed a stopped rank, say):
    /// once a payload from every live peer has arrived after it, the rank
    /// prints `heard from every live peer since mark N`, N counting the
    /// marks from 1. Returns N.
    pub fn mark(&mut self) -> u32 {
        self.marks += 1;
        let mut st = lock(&self.state);
        for p in &mut st.peers {
            p.after_mark = 0;
        }
        self.awaited.retain(|s| !matches!(s, Since::Mark(_)));
        self.awaited.push(Since::Mark(self.marks));
        self.marks
    }

    /// Whether this rank has heard from every live peer since the first
    /// failure it heard of (and printed so).
    pub fn heard_since_failure(&self) -> bool {
        !self.awaited.contains(&Since::Failure)
    }

    /// Whether this rank has heard from every live peer since its latest
    /// mark (and printed so); false before the first mark.
    pub fn heard_since_mark(&self) -> bool {
        self.marks > 0 && !self.awaited.contains(&Since::Mark(self.marks))
    }

    /// How many marks there have been.
    pub fn marks(&self) -> u32 {
        self.marks
    }

    /// Prints the line of each awaited moment since which every live peer
    /// has been heard from.
    fn tell_heard_since(&mut self, st: &State) {
        let me = self.me;
        self.awaited.retain(|&since| {
            let heard = match since {
                Since::Failure => {
                    st.first_failure.is_some() && st.heard_all(me, |p| p.after_failure)
                }
                Since::Mark(_) => st.heard_all(me, |p| p.after_mark),
            };
            if heard {
                let what = match since {
                    Since::Failure => "the failure".to_string(),
                    Since::Mark(n) => format!("mark {n}"),
                };
                eprintln!("mesh: rank {me}: heard from every live peer since {what}");
            }
            !heard
        });
    }

    /// One turn: progress, then at most one payload to each peer whose
    /// window has room while the traffic lasts, then the close. `Some`
    /// once the close is over (or has given up): the rank may shut down.
    pub fn step(&mut self) -> Option<MeshReport> {
        self.btl.progress();
        let now = self.btl.config().clock.now();
        self.maybe_report(now);
        let state = self.state.clone();
        let st = lock(&state);
        if self.closing_since.is_none() {
            self.tell_heard_since(&st);
        }
        let others = (0..self.size).filter(|&r| r != self.me);
        let Some(until) = self.traffic_until else {
            // Traffic starts with a payload to everyone; it is timed from
            // when every peer has been heard from.
            let heard = others
                .clone()
                .all(|r| st.peers[r as usize].received > 0 || !st.peers[r as usize].live());
            if heard || now.saturating_sub(self.start) >= self.opts.start_within {
                if heard {
                    eprintln!(
                        "mesh: rank {}: heard from every peer {:.3} s into the run",
                        self.me,
                        now.saturating_sub(self.start).as_secs_f64()
                    );
                }
                self.traffic_until = Some(now + self.opts.traffic);
            }
            drop(st);
            self.send_round();
            return None;
        };
        if now < until {
            drop(st);
            self.send_round();
            return None;
        }
        let Some(since) = self.closing_since else {
            self.closing_since = Some(now);
            let done: Vec<(Rank, u64)> = others
                .filter(|&r| st.peers[r as usize].live())
                .map(|r| (r, st.peers[r as usize].sent))
                .collect();
            drop(st);
            for (r, sent) in done {
                let _ = self.btl.send(r, DONE, &[], &sent.to_le_bytes());
            }
            return None;
        };
        let all_closed = others.clone().all(|r| st.peers[r as usize].closed());
        let gave_up = now.saturating_sub(since) >= self.opts.close_within;
        if (all_closed && self.btl.is_idle()) || gave_up {
            let unclosed: Vec<Rank> = others.filter(|&r| !st.peers[r as usize].closed()).collect();
            return Some(MeshReport {
                rank: self.me,
                peers: st.peers.clone(),
                unclosed,
                ran: now.saturating_sub(self.start),
            });
        }
        None
    }

    fn maybe_report(&mut self, now: Duration) {
        let Some(every) = self.report_every else {
            return;
        };
        if now >= self.next_refused_look {
            // Each connection request turned away (a stranger's, or a
            // crossing one) is told, with its reason, as it happens
            // (within 100 ms).
            self.next_refused_look = now + Duration::from_millis(100);
            for n in self.btl.take_notices() {
                if let xrcbtl_btl::Notice::Refused { rank, reason } = n {
                    let from = rank.map_or("a stranger".to_string(), |r| format!("rank {r}"));
                    eprintln!(
                        "mesh: rank {}: refused a connection request from {from}: {reason:?}",
                        self.me
                    );
                }
            }
        }
        if now < self.next_report {
            return;
        }
        self.next_report = now + every;
        let st = lock(&self.state);
        let counts: Vec<String> = st
            .peers
            .iter()
            .enumerate()
            .filter(|&(r, _)| r as Rank != self.me)
            .map(|(r, p)| {
                let mark = if p.live() { "" } else { " failed" };
                format!("{r}:{}/{}{mark}", p.sent, p.received)
            })
            .collect();
        eprintln!(
            "mesh: rank {}: {:.1} s: sent/received {}",
            self.me,
            now.saturating_sub(self.start).as_secs_f64(),
            counts.join(" ")
        );
    }

    fn send_round(&mut self) {
        for r in (0..self.size).filter(|&r| r != self.me) {
            let mut st = lock(&self.state);
            let after_failure = st.first_failure.is_some();
            if self.opts.silent_after_failure && after_failure {
                return;
            }
            let p = &st.peers[r as usize];
            if !p.live() || p.sent - p.acked >= self.opts.window {
                continue;
            }
            let seq = p.sent;
            let len = self.opts.sizes[(seq % self.opts.sizes.len() as u64) as usize];
            st.peers[r as usize].sent += 1;
            drop(st);
            if let Err(e) =
                self.btl
                    .send_bytes(r, DATA, payload(self.me, seq, len, after_failure), None)
            {
                // The error callback names the failure; a send refused
                // here before it ran is recorded alike.
                let mut st = lock(&self.state);
                let at = self.btl.config().clock.now().saturating_sub(self.start);
                st.first_failure.get_or_insert(at);
                st.peers[r as usize].failed.get_or_insert((
                    at,
                    epoch_now(),
                    format!("send refused: {e}"),
                ));
            }
        }
    }
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a rank's run ended.
#[derive(Debug, Clone)]
pub struct MeshReport {
    /// The rank.
    pub rank: Rank,
    /// Its logs of every rank (its own is empty).
    pub peers: Vec<PeerLog>,
    /// Live peers whose close never came.
    pub unclosed: Vec<Rank>,
    /// How long the run took on the rank's clock.
    pub ran: Duration,
}

impl MeshReport {
    /// Holds the run against what was done: `victims` were killed, so each
    /// must be reported failed (within `notice`, if given, of `killed_at`
    /// on the rank's clock); every other peer must be live, have closed
    /// with every payload it announced received intact, and, when there
    /// were victims, have gone on sending after the first failure.
    pub fn check(&self, victims: &[Rank]) -> Result<(), String> {
        let mut wrong = Vec::new();
        for (r, p) in self.peers.iter().enumerate() {
            let r = r as Rank;
            if r == self.rank {
                continue;
            }
            if let Some(c) = &p.corrupt {
                wrong.push(c.clone());
            }
            if victims.contains(&r) {
                if p.live() {
                    wrong.push(format!("rank {r} was killed but never reported failed"));
                }
                continue;
            }
            if let Some((at, _, why)) = &p.failed {
                wrong.push(format!(
                    "rank {r} reported failed at {:.3} s: {why}",
                    at.as_secs_f64()
                ));
                continue;
            }
            match p.announced {
                None => wrong.push(format!("no DONE from rank {r}")),
                Some(n) if n != p.received || p.arrived != n => wrong.push(format!(
                    "rank {r} sent {n} payloads, {} arrived ({} in a row from the first)",
                    p.arrived, p.received
                )),
                Some(_) => {}
            }
            if !p.fin {
                wrong.push(format!("no FIN from rank {r}"));
            }
            if !victims.is_empty() && p.after_failure == 0 {
                wrong.push(format!("nothing from rank {r} sent after the failure"));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }

    /// One line: what was sent to and received from each peer, and who
    /// failed when.
    pub fn summary(&self) -> String {
        let mut s = format!("rank {} ran {:.3} s:", self.rank, self.ran.as_secs_f64());
        for (r, p) in self.peers.iter().enumerate() {
            if r as Rank == self.rank {
                continue;
            }
            s += &format!(" [{r}: sent {} received {}", p.sent, p.received);
            if let Some((at, wall, _)) = &p.failed {
                s += &format!(" failed at {:.3} s ({wall:.3})", at.as_secs_f64());
            } else {
                s += &format!(" after-failure {}", p.after_failure);
            }
            s += "]";
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xrcbtl_btl::sim::SimJob;
    use xrcbtl_fabric::sim::SimDevice;

    /// How a test run's traffic ends.
    #[derive(Clone, Copy, PartialEq)]
    enum Steer {
        /// After the options' traffic time.
        Clock,
        /// Told by the test, as a harness tells through the stop file:
        /// with a crash, once every survivor has heard from every live
        /// peer since the failure; without, once every rank has heard
        /// from every peer since a mark made when all had started.
        Told,
    }

    /// Runs `ranks` mesh ranks on one simulated job of `nodes` nodes;
    /// `crash` crashes a rank once every rank has been heard from by rank
    /// 0 and `after` has passed. Returns the survivors' reports.
    fn run(
        device: SimDevice,
        nodes: usize,
        per_node: usize,
        crash: Option<(Rank, Duration)>,
    ) -> Vec<MeshReport> {
        run_steered(device, nodes, per_node, crash, Steer::Clock, false)
    }

    fn run_steered(
        device: SimDevice,
        nodes: usize,
        per_node: usize,
        crash: Option<(Rank, Duration)>,
        steer: Steer,
        silent_after_failure: bool,
    ) -> Vec<MeshReport> {
        let mut job = SimJob::new(5, nodes, per_node, device).unwrap();
        let size = (nodes * per_node) as u32;
        let opts = MeshOptions {
            traffic: if steer == Steer::Clock {
                Duration::from_millis(2)
            } else {
                Duration::from_secs(3600)
            },
            window: 16,
            // The largest goes by registration from the test's heap,
            // which the userfaultfd monitor then watches.
            sizes: vec![12, 300, 20_000],
            close_within: Duration::from_secs(5),
            start_within: Duration::from_secs(5),
            silent_after_failure,
        };
        let mut meshes: Vec<Option<Mesh<_>>> = (0..size)
            .map(|r| Some(Mesh::new(job.btl(r).clone(), size, opts.clone())))
            .collect();
        let mut reports = Vec::new();
        let mut crash_at = None;
        let mut marked = false;
        let mut told = false;
        let mut rounds = 0u64;
        while meshes.iter().any(Option::is_some) {
            rounds += 1;
            assert!(rounds < 5_000_000, "the mesh stopped making progress");
            for m in meshes.iter_mut() {
                if let Some(report) = m.as_mut().and_then(Mesh::step) {
                    reports.push(report);
                    *m = None;
                }
            }
            if let Some((victim, after)) = crash {
                let heard = meshes[0]
                    .as_ref()
                    .is_some_and(|m| m.traffic_until.is_some());
                if crash_at.is_none() && heard {
                    crash_at = Some(job.now() + after);
                }
                if crash_at.is_some_and(|t| job.now() >= t) && meshes[victim as usize].is_some() {
                    meshes[victim as usize] = None;
                    job.crash(victim);
                }
            }
            if steer == Steer::Told && !told {
                let live = || meshes.iter().flatten();
                let seen = match crash {
                    Some(_) => crash_at.is_some() && live().all(Mesh::heard_since_failure),
                    None if !marked => {
                        if live().all(|m| m.traffic_until.is_some()) {
                            meshes.iter_mut().flatten().for_each(|m| {
                                m.mark();
                            });
                            marked = true;
                        }
                        false
                    }
                    None => live().all(Mesh::heard_since_mark),
                };
                // A run whose survivors never hear from each other again
                // is told at last by the clock, as a harness's limit does.
                if seen || job.now() > Duration::from_secs(60) {
                    meshes.iter_mut().flatten().for_each(Mesh::end_traffic);
                    told = true;
                }
            }
            job.idle_round(Duration::from_micros(5));
        }
        reports
    }

    #[test]
    fn every_payload_arrives_once_in_order_and_intact() {
        for device in [
            SimDevice::ib("sim0"),
            SimDevice::roce("sim0"),
            SimDevice::iwarp("sim0"),
        ] {
            let reports = run(device, 2, 2, None);
            eprintln!("{}", reports[0].summary());
            assert_eq!(reports.len(), 4);
            for r in &reports {
                r.check(&[])
                    .unwrap_or_else(|e| panic!("{}: {e}", r.summary()));
                assert!(
                    r.peers.iter().all(|p| p.sent == 0 || p.received > 10),
                    "{}",
                    r.summary()
                );
            }
        }
    }

    #[test]
    fn survivors_report_a_crashed_rank_and_go_on_with_the_others() {
        for device in [SimDevice::ib("sim0"), SimDevice::roce("sim0")] {
            let reports = run(device, 2, 2, Some((3, Duration::from_micros(500))));
            assert_eq!(reports.len(), 3);
            for r in &reports {
                eprintln!("{}", r.summary());
                r.check(&[3])
                    .unwrap_or_else(|e| panic!("{}: {e}", r.summary()));
                // The check refuses the run if the victim were not named.
                assert!(r.check(&[]).is_err());
            }
        }
    }

    /// Four ranks on two InfiniBand nodes, rank 3 crashed, the traffic
    /// ended once the survivors heard from each other since.
    fn told_after_a_crash(silent_after_failure: bool) -> Vec<MeshReport> {
        let crash = Some((3, Duration::from_micros(500)));
        let device = SimDevice::ib("sim0");
        run_steered(device, 2, 2, crash, Steer::Told, silent_after_failure)
    }

    #[test]
    fn a_run_told_to_stop_carries_traffic_after_the_failure_and_the_mark() {
        let reports = told_after_a_crash(false);
        assert_eq!(reports.len(), 3);
        for r in &reports {
            r.check(&[3])
                .unwrap_or_else(|e| panic!("{}: {e}", r.summary()));
            // Told, not timed out: well within the hour of traffic.
            assert!(r.ran < Duration::from_secs(60), "{}", r.summary());
        }
        let reports = run_steered(SimDevice::roce("sim0"), 2, 2, None, Steer::Told, false);
        assert_eq!(reports.len(), 4);
        for r in &reports {
            r.check(&[])
                .unwrap_or_else(|e| panic!("{}: {e}", r.summary()));
            assert!(r.ran < Duration::from_secs(60), "{}", r.summary());
            for (peer, p) in r.peers.iter().enumerate() {
                assert!(
                    peer as Rank == r.rank || p.after_mark > 0,
                    "{}",
                    r.summary()
                );
            }
        }
    }

    #[test]
    fn survivors_that_fall_silent_at_the_failure_fail_the_check() {
        let reports = told_after_a_crash(true);
        assert_eq!(reports.len(), 3);
        for r in &reports {
            let why = r.check(&[3]).unwrap_err();
            assert!(why.contains("after the failure"), "{why}");
        }
    }

    #[test]
    fn the_checker_finds_loss_corruption_and_silence() {
        let good = PeerLog {
            sent: 5,
            received: 5,
            arrived: 5,
            acked: 5,
            announced: Some(5),
            fin: true,
            after_failure: 1,
            ..PeerLog::default()
        };
        let report = |p: PeerLog| MeshReport {
            rank: 0,
            peers: vec![PeerLog::default(), p],
            unclosed: vec![],
            ran: Duration::ZERO,
        };
        report(good.clone()).check(&[]).unwrap();
        let lost = PeerLog {
            received: 3,
            arrived: 4,
            ..good.clone()
        };
        assert!(report(lost)
            .check(&[])
            .unwrap_err()
            .contains("5 payloads, 4 arrived"));
        let corrupt = PeerLog {
            corrupt: Some("byte 3".into()),
            ..good.clone()
        };
        assert!(report(corrupt).check(&[]).is_err());
        let no_fin = PeerLog {
            fin: false,
            ..good.clone()
        };
        assert!(report(no_fin).check(&[]).is_err());
        assert!(report(good.clone())
            .check(&[1])
            .unwrap_err()
            .contains("never reported failed"));
        assert!(check_payload(1, 2, 100, &payload(1, 2, 100, false)).is_none());
        assert!(check_payload(1, 2, 100, &payload(1, 2, 100, true)).is_none());
        assert!(check_payload(1, 3, 100, &payload(1, 2, 100, false)).is_some());
        assert!(check_payload(2, 2, 100, &payload(1, 2, 100, false)).is_some());
        let mut p = payload(1, 2, 100, false).to_vec();
        p[50] ^= 1;
        assert!(check_payload(1, 2, 100, &p).unwrap().contains("byte 50"));
    }
}
