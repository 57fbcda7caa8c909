//! Where benchmark ranks live: one rank's view ([`BenchRank`]), the
//! executors that drive rank bodies (all ranks in virtual time on the
//! simulated fabric, or one rank against a wall clock), and the
//! out-of-band exchanges that introduce the ranks of separate processes.

use std::cell::Cell;
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use xrcbtl_btl::sim::SimJob;
use xrcbtl_btl::{Btl, Bytes, Peer, Tag};
use xrcbtl_fabric::{Context, Error, Result};

/// Tag of benchmark payloads.
pub const DATA: Tag = 1;
/// Tag of barrier messages.
pub const BARRIER: Tag = 2;

/// A future that is pending once (lets the executor run the other ranks).
#[derive(Default)]
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

/// One rank of a benchmark: its BTL, what it has received, a payload
/// buffer.
pub struct BenchRank<C: Context> {
    /// The BTL.
    pub btl: Arc<Btl<C>>,
    /// This rank.
    pub rank: u32,
    /// Ranks in the world.
    pub size: u32,
    data: Arc<AtomicU64>,
    data_seen: u64,
    barrier: Arc<AtomicU64>,
    barrier_seen: u64,
    work: Rc<Cell<u64>>,
    buf: Bytes,
    /// The first peer failure the BTL reported, if any (read without a
    /// lock by every spin of a wait).
    failed: Arc<std::sync::OnceLock<String>>,
    /// The only rank its thread runs: an empty progress call need not let
    /// other ranks' tasks run.
    solo: bool,
}

impl<C: Context> BenchRank<C> {
    /// Wraps a BTL whose peers are added; `max` is the largest payload.
    pub fn new(btl: Arc<Btl<C>>, size: u32, max: usize, work: Rc<Cell<u64>>) -> Self {
        let rank = btl.rank();
        let data = Arc::new(AtomicU64::new(0));
        let barrier = Arc::new(AtomicU64::new(0));
        let d = data.clone();
        btl.register_am(DATA, move |_, _| {
            d.fetch_add(1, Ordering::Relaxed);
        });
        let b = barrier.clone();
        btl.register_am(BARRIER, move |_, _| {
            b.fetch_add(1, Ordering::Relaxed);
        });
        // The payload: every byte set, so that nothing is sent from a
        // page the kernel has not populated.
        let buf = Bytes::from(vec![0x5a; max.max(1)]);
        // A peer's failure ends the run with its reason: every wait below
        // looks at it, so a dead peer is never waited for forever.
        let failed = Arc::new(std::sync::OnceLock::new());
        let f = failed.clone();
        btl.register_error(move |_, rank, e| {
            // The first failure is the one reported.
            let _ = f.set(format!("rank {rank} failed: {e}"));
        });
        BenchRank {
            btl,
            rank,
            size,
            data,
            data_seen: 0,
            barrier,
            barrier_seen: 0,
            work,
            buf,
            failed,
            solo: false,
        }
    }

    /// The BTL's clock (virtual on the simulated fabric).
    pub fn now(&self) -> Duration {
        self.btl.config().clock.now()
    }

    /// Sends `len` bytes of the payload to `dst`, as an MPI library hands
    /// the BTL a user buffer: eagerly (copied when short, else straight
    /// from the buffer), or by rendezvous straight from it.
    pub fn send(&mut self, dst: u32, len: usize) -> Result<()> {
        if len < self.btl.config().zcopy_min {
            self.btl.send(dst, DATA, &[], &self.buf[..len])
        } else {
            self.btl
                .send_bytes(dst, DATA, self.buf.slice(..len), None)?;
            Ok(())
        }
    }

    /// One progress call; an error once a peer has failed.
    async fn poll(&mut self) -> Result<()> {
        let w = self.btl.progress() as u64;
        self.work.set(self.work.get() + w);
        if w == 0 {
            if let Some(why) = self.failed.get() {
                return Err(Error::state(format!("rank {}: {why}", self.rank)));
            }
            if !self.solo {
                YieldNow::default().await;
            }
        }
        Ok(())
    }

    /// Marks this rank as the only one its thread runs (one rank per
    /// process): waits then spin on progress without going back to the
    /// executor on every empty call.
    pub fn set_solo(&mut self) {
        self.solo = true;
    }

    /// [`BenchRank::wait`] for a rank marked solo ([`BenchRank::set_solo`]),
    /// whose waits never go back to the executor: spins on progress here,
    /// outside any future.
    pub fn spin_wait(&mut self, n: u64) -> Result<()> {
        debug_assert!(self.solo, "only a solo rank spins outside the executor");
        while self.data.load(Ordering::Relaxed) - self.data_seen < n {
            let w = self.btl.progress() as u64;
            self.work.set(self.work.get() + w);
            if w == 0 {
                if let Some(why) = self.failed.get() {
                    return Err(Error::state(format!("rank {}: {why}", self.rank)));
                }
            }
        }
        self.data_seen += n;
        Ok(())
    }

    /// Whether this rank is the only one its thread runs.
    pub fn is_solo(&self) -> bool {
        self.solo
    }

    /// Waits for `n` more payload messages (an error if a peer fails).
    pub async fn wait(&mut self, n: u64) -> Result<()> {
        while self.data.load(Ordering::Relaxed) - self.data_seen < n {
            self.poll().await?;
        }
        self.data_seen += n;
        Ok(())
    }

    /// Waits until nothing is outstanding (an error if a peer fails).
    pub async fn flush(&mut self) -> Result<()> {
        while !self.btl.is_idle() {
            self.poll().await?;
        }
        Ok(())
    }

    /// Every rank arrives before any leaves (through rank 0).
    pub async fn barrier(&mut self) -> Result<()> {
        if self.rank == 0 {
            let others = u64::from(self.size - 1);
            while self.barrier.load(Ordering::Relaxed) - self.barrier_seen < others {
                self.poll().await?;
            }
            self.barrier_seen += others;
            for r in 1..self.size {
                self.btl.send(r, BARRIER, &[], &[])?;
            }
        } else {
            self.btl.send(0, BARRIER, &[], &[])?;
            while self.barrier.load(Ordering::Relaxed) - self.barrier_seen < 1 {
                self.poll().await?;
            }
            self.barrier_seen += 1;
        }
        self.flush().await
    }
}

/// A rank's body, boxed for an executor.
pub type Body<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs every rank's body on a simulated job, in virtual time: each round
/// polls every unfinished body; a round in which no rank found work moves
/// the clock to the next scheduled event or connection timer, unless the
/// causal clock holds it back (a rank has not yet looked at what is queued
/// for it: with costly events, a BTL looks at its connection events only
/// on its control ticks). Body `i` is rank `i`'s: once it is done, the
/// rank is still progressed while the clock is held back.
pub fn run_sim<'a, T>(
    job: &mut SimJob,
    work: &Rc<Cell<u64>>,
    mut bodies: Vec<Body<'a, T>>,
) -> Vec<T> {
    let mut cx = TaskContext::from_waker(Waker::noop());
    let mut out: Vec<Option<T>> = bodies.iter().map(|_| None).collect();
    let mut idle_rounds = 0u64;
    loop {
        let before = work.get();
        let mut finished = false;
        for (i, b) in bodies.iter_mut().enumerate() {
            if out[i].is_some() {
                continue;
            }
            if let Poll::Ready(v) = b.as_mut().poll(&mut cx) {
                out[i] = Some(v);
                finished = true;
            }
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().map(|v| v.expect("finished")).collect();
        }
        if work.get() == before && !finished {
            // Time moves to what is scheduled next, or by a millisecond.
            if !job.idle_round(Duration::from_millis(1)) {
                // The causal clock waits for every process to look at what
                // is queued for it, a rank whose body is done too: it is
                // progressed here in its stead (body `i` is rank `i`).
                for (i, _) in out.iter().enumerate().filter(|(_, o)| o.is_some()) {
                    job.peek(i as u32).progress();
                }
            }
            idle_rounds += 1;
            assert!(
                idle_rounds < 50_000_000,
                "the simulated benchmark stopped making progress"
            );
        }
    }
}

/// Runs one rank's body to completion, polling as fast as it can (a real
/// fabric: the body progresses the BTL at every poll).
pub fn block_on<T>(body: impl Future<Output = T>) -> T {
    let mut cx = TaskContext::from_waker(Waker::noop());
    let mut body = std::pin::pin!(body);
    loop {
        if let Poll::Ready(v) = body.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

/// The perftest-style exchange between two processes: the server (`-s`,
/// rank 1) listens on `port`, the client (rank 0) connects to
/// `host:port`; each sends its rank, node and BTL address and reads the
/// other's.
///
/// The server answers only a client that says a well-formed hello of the
/// other rank within `timeout`: anyone else on the port (a port scanner, a
/// stray tool, a line that never ends) is refused with a line on stderr
/// and the server waits on for its client. A client fails at once on a
/// host name that does not resolve, and after `timeout` when nobody
/// listens, naming the address either way.
pub fn exchange_tcp(
    me: Peer,
    server: bool,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Peer> {
    let io = |e: std::io::Error| Error::Verbs {
        verb: "out-of-band exchange",
        source: e,
    };
    let hello = hello_line(&me);
    if server {
        let l = TcpListener::bind(("0.0.0.0", port)).map_err(io)?;
        loop {
            let (stream, from) = l.accept().map_err(io)?;
            match answer(stream, &hello, me.rank, timeout) {
                Ok(peer) => return Ok(peer),
                Err(why) => eprintln!("out-of-band exchange: refused {from}: {why}"),
            }
        }
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::invalid(format!(
                "out-of-band exchange: cannot resolve {host:?}: {e}"
            ))
        })?
        .collect();
    let end = Instant::now() + timeout;
    let stream = loop {
        if let Some(s) = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).ok())
        {
            break s;
        }
        if Instant::now() >= end {
            return Err(Error::state(format!(
                "out-of-band exchange: no server listens at {host}:{port} after {timeout:?} \
                 (start the other side with -s)"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    (&stream).write_all(hello.as_bytes()).map_err(io)?;
    let line = read_hello(&stream)
        .map_err(|why| Error::invalid(format!("out-of-band exchange with {host}:{port}: {why}")))?;
    parse_peer(&line)
        .ok_or_else(|| Error::invalid(format!("out-of-band exchange: bad line {line:?}")))
}

/// The line that introduces `me` to the other ranks.
fn hello_line(me: &Peer) -> String {
    let receive = me.receive.map_or("-".to_string(), |r| r.to_string());
    let ib = me.ib.map_or("-".to_string(), |a| a.to_string());
    format!(
        "xrcbtl-osu 2 {} {} {} {receive} {ib}\n",
        me.rank, me.node, me.addr
    )
}

/// The exchange through a directory that every rank of a job can read
/// (one host, or namespaces of one host): each rank writes its hello to
/// `DIR/rank-N` (whole, by a rename) and reads every other rank's,
/// waiting up to `timeout` for the last. Returns the `size` ranks in rank
/// order, `me` among them.
pub fn exchange_dir(
    me: Peer,
    dir: &std::path::Path,
    size: u32,
    timeout: Duration,
) -> Result<Vec<Peer>> {
    let io = |e: std::io::Error| Error::Verbs {
        verb: "out-of-band exchange",
        source: e,
    };
    if me.rank >= size {
        return Err(Error::invalid(format!(
            "rank {} of a job of {size} ranks",
            me.rank
        )));
    }
    let tmp = dir.join(format!(".rank-{}.{}", me.rank, std::process::id()));
    std::fs::write(&tmp, hello_line(&me)).map_err(io)?;
    std::fs::rename(&tmp, dir.join(format!("rank-{}", me.rank))).map_err(io)?;
    let end = Instant::now() + timeout;
    let mut peers = Vec::with_capacity(size as usize);
    for r in 0..size {
        let path = dir.join(format!("rank-{r}"));
        let line = loop {
            match std::fs::read_to_string(&path) {
                Ok(line) => break line,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < end => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::state(format!(
                        "out-of-band exchange: no hello from rank {r} at {} after {timeout:?}: {e}",
                        path.display()
                    )))
                }
            }
        };
        let peer = parse_peer(&line).filter(|p| p.rank == r).ok_or_else(|| {
            Error::invalid(format!(
                "out-of-band exchange: {} holds {:?}",
                path.display(),
                line.trim_end()
            ))
        })?;
        peers.push(peer);
    }
    Ok(peers)
}

/// The longest hello line read (a stranger's endless line stops here).
const HELLO_MAX: u64 = 512;

/// One line from `stream`, of at most [`HELLO_MAX`] bytes.
fn read_hello(stream: &TcpStream) -> std::result::Result<String, String> {
    let mut line = String::new();
    let n = BufReader::new(std::io::Read::take(stream, HELLO_MAX))
        .read_line(&mut line)
        .map_err(|e| format!("no hello: {e}"))?;
    if n == 0 || !line.ends_with('\n') {
        return Err(format!("no complete hello line (read {n} bytes)"));
    }
    Ok(line)
}

/// The server's side of one connection: a well-formed hello from another
/// rank gets ours back.
fn answer(
    stream: TcpStream,
    hello: &str,
    me: u32,
    timeout: Duration,
) -> std::result::Result<Peer, String> {
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let line = read_hello(&stream)?;
    let shown: String = line.trim_end().chars().take(80).collect();
    let peer = parse_peer(&line).ok_or_else(|| format!("not an xrcbtl-osu hello: {shown:?}"))?;
    if peer.rank == me {
        return Err(format!("a hello from this process's own rank {me}"));
    }
    (&stream)
        .write_all(hello.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(peer)
}

/// Bytes in a fixed-size text record, for exchanges (MPI's all-gather)
/// that need every rank's contribution to have one size.
pub const RECORD: usize = 160;

/// `text` as a NUL-padded record; an error if it does not fit.
pub fn record(text: &str) -> Result<[u8; RECORD]> {
    let mut r = [0; RECORD];
    if text.len() >= RECORD {
        return Err(Error::invalid(format!("record too long: {text:?}")));
    }
    r[..text.len()].copy_from_slice(text.as_bytes());
    Ok(r)
}

/// The text of a record, up to its first NUL.
pub fn record_text(r: &[u8]) -> String {
    let end = r.iter().position(|&b| b == 0).unwrap_or(r.len());
    String::from_utf8_lossy(&r[..end]).into_owned()
}

/// The exchange's decoder of a hello line, checked on any bytes (for the
/// fuzzer): bytes that are not UTF-8 never reach it (the reader refuses
/// them), it does not panic, and a peer it decodes encodes to a line that
/// decodes to the same peer.
pub fn check_hello_roundtrip(bytes: &[u8]) -> std::result::Result<(), String> {
    let Ok(line) = std::str::from_utf8(bytes) else {
        return Ok(());
    };
    let Some(p) = parse_peer(line) else {
        return Ok(());
    };
    let again = hello_line(&p);
    match parse_peer(&again) {
        Some(q) if q == p => Ok(()),
        q => Err(format!(
            "{line:?} decodes to {p:?}, which encodes to {again:?}, which decodes to {q:?}"
        )),
    }
}

fn parse_peer(line: &str) -> Option<Peer> {
    let mut f = line.split_whitespace();
    if f.next()? != "xrcbtl-osu" || f.next()? != "2" {
        return None;
    }
    let rank = f.next()?.parse().ok()?;
    let node = f.next()?.parse().ok()?;
    let addr: SocketAddr = f.next()?.parse().ok()?;
    let receive = match f.next()? {
        "-" => None,
        r => Some(r.parse().ok()?),
    };
    let ib = match f.next()? {
        "-" => None,
        a => Some(a.parse().ok()?),
    };
    if f.next().is_some() {
        return None;
    }
    Some(Peer {
        rank,
        node,
        addr,
        ib,
        receive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_lines_parse_strictly() {
        let p = parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000 xrc/64769/1234 -\n").unwrap();
        assert_eq!((p.rank, p.node), (0, 1));
        assert_eq!(p.addr, "10.0.0.1:4000".parse().unwrap());
        assert_eq!(
            p.receive,
            Some(xrcbtl_btl::Receive::Xrc(xrcbtl_btl::XrcdId {
                dev: 64769,
                ino: 1234
            }))
        );
        let p = parse_peer(
            "xrcbtl-osu 2 0 1 10.0.0.1:4000 rc ib:fe800000000000000002c90300a1b2c3/ffff/4791",
        )
        .unwrap();
        assert_eq!(p.receive, Some(xrcbtl_btl::Receive::Rc));
        let ib = p.ib.unwrap();
        assert_eq!(
            (ib.gid.0[0], ib.gid.0[15], ib.pkey, ib.port),
            (0xfe, 0xc3, 0xffff, 4791)
        );
        assert_eq!(ib.to_string().parse::<xrcbtl_btl::IbAddr>().unwrap(), ib);
        assert_eq!(
            parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000 - -")
                .unwrap()
                .receive,
            None
        );
        assert!(parse_peer("xrcbtl-osu 1 0 1 10.0.0.1:4000").is_none());
        assert!(parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000").is_none());
        assert!(parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000 xrc/1 -").is_none());
        assert!(parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000 rc ib:fe80/ffff/1").is_none());
        assert!(parse_peer("xrcbtl-osu 2 0 1 10.0.0.1:4000 rc - x").is_none());
        assert!(parse_peer("hello").is_none());
        assert!(parse_peer("xrcbtl-osu 2 0 1 nowhere rc -").is_none());
    }

    #[test]
    fn records_pad_and_refuse_overflow() {
        let r = record("host 42").unwrap();
        assert_eq!(record_text(&r), "host 42");
        assert!(record(&"x".repeat(RECORD)).is_err());
        assert_eq!(record_text(&[b'a'; 3]), "aaa");
    }

    fn peer(rank: u32) -> Peer {
        Peer {
            rank,
            node: rank,
            addr: format!("127.0.0.1:{}", 4000 + rank).parse().unwrap(),
            ib: None,
            receive: None,
        }
    }

    /// A port nobody listens on right now.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn the_exchange_server_outlives_strangers_and_serves_its_client() {
        let port = free_port();
        let t = Duration::from_millis(500);
        let server = std::thread::spawn(move || exchange_tcp(peer(1), true, "", port, t));
        let connect = || loop {
            if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                break s;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // A web request, a line that never ends, one that says nothing and
        // hangs up, one that is silent past the timeout, a hello from the
        // server's own rank: each refused, none ends the server.
        let mut s = connect();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut s = connect();
        s.write_all(&[b'x'; 4096]).unwrap();
        drop(connect());
        let silent = connect();
        std::thread::sleep(Duration::from_millis(600));
        drop(silent);
        let mut s = connect();
        s.write_all(b"xrcbtl-osu 2 1 1 127.0.0.1:4001 - -\n")
            .unwrap();
        drop(s);
        let client = exchange_tcp(peer(0), false, "127.0.0.1", port, Duration::from_secs(5));
        let got = server
            .join()
            .unwrap()
            .expect("the server serves its client");
        assert_eq!(got.rank, 0);
        assert_eq!(client.expect("the client gets the server's hello").rank, 1);
    }

    #[test]
    fn the_directory_exchange_introduces_every_rank_and_times_out_naming_the_missing() {
        let dir = std::env::temp_dir().join(format!("xrcbtl-exchange-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let d = dir.clone();
        let threads: Vec<_> = (0..3)
            .map(|r| {
                let d = d.clone();
                std::thread::spawn(move || exchange_dir(peer(r), &d, 3, Duration::from_secs(10)))
            })
            .collect();
        for t in threads {
            let peers = t.join().unwrap().unwrap();
            let got: Vec<_> = peers.iter().map(|p| (p.rank, p.addr.port())).collect();
            assert_eq!(got, [(0, 4000), (1, 4001), (2, 4002)]);
        }
        // A job of four: rank 3 never writes.
        let err = exchange_dir(peer(0), &dir, 4, Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no hello from rank 3"), "{err}");
        std::fs::write(dir.join("rank-3"), "hello\n").unwrap();
        let err = exchange_dir(peer(0), &dir, 4, Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank-3 holds \"hello\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_client_without_a_server_fails_soon_naming_the_address() {
        let port = free_port();
        let start = Instant::now();
        let err = exchange_tcp(
            peer(0),
            false,
            "127.0.0.1",
            port,
            Duration::from_millis(300),
        )
        .unwrap_err()
        .to_string();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
        let start = Instant::now();
        let err = exchange_tcp(
            peer(0),
            false,
            "no-such-host.invalid",
            port,
            Duration::from_secs(60),
        )
        .unwrap_err()
        .to_string();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
        assert!(
            err.contains("cannot resolve \"no-such-host.invalid\""),
            "{err}"
        );
    }

    #[test]
    fn a_failed_peer_ends_the_wait_with_its_reason() {
        use xrcbtl_fabric::sim::SimDevice;
        let mut job = SimJob::new(7, 2, 1, SimDevice::ib("sim0")).unwrap();
        let work = Rc::new(Cell::new(0));
        let mut r0 = BenchRank::new(job.btl(0).clone(), 2, 64, work.clone());
        let _r1 = BenchRank::new(job.btl(1).clone(), 2, 64, work.clone());
        // Connected first.
        r0.send(1, 8).unwrap();
        job.settle(Duration::from_secs(5)).unwrap();
        job.crash(1);
        let start = job.now();
        let body: Body<'_, Result<()>> = Box::pin(async move {
            r0.send(1, 8)?;
            r0.wait(1).await
        });
        let out = run_sim(&mut job, &work, vec![body]);
        let err = out.into_iter().next().unwrap().unwrap_err().to_string();
        assert!(err.contains("rank 1 failed"), "{err}");
        let took = job.now() - start;
        assert!(took < Duration::from_secs(60), "{took:?}");
        eprintln!("the failure ended the wait after {took:?} of virtual time: {err}");
    }
}
