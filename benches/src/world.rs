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

    async fn poll(&mut self) {
        let w = self.btl.progress() as u64;
        self.work.set(self.work.get() + w);
        if w == 0 {
            YieldNow::default().await;
        }
    }

    /// Waits for `n` more payload messages.
    pub async fn wait(&mut self, n: u64) {
        while self.data.load(Ordering::Relaxed) - self.data_seen < n {
            self.poll().await;
        }
        self.data_seen += n;
    }

    /// Waits until nothing is outstanding.
    pub async fn flush(&mut self) {
        while !self.btl.is_idle() {
            self.poll().await;
        }
    }

    /// Every rank arrives before any leaves (through rank 0).
    pub async fn barrier(&mut self) -> Result<()> {
        if self.rank == 0 {
            let others = u64::from(self.size - 1);
            while self.barrier.load(Ordering::Relaxed) - self.barrier_seen < others {
                self.poll().await;
            }
            self.barrier_seen += others;
            for r in 1..self.size {
                self.btl.send(r, BARRIER, &[], &[])?;
            }
        } else {
            self.btl.send(0, BARRIER, &[], &[])?;
            while self.barrier.load(Ordering::Relaxed) - self.barrier_seen < 1 {
                self.poll().await;
            }
            self.barrier_seen += 1;
        }
        self.flush().await;
        Ok(())
    }
}

/// A rank's body, boxed for an executor.
pub type Body<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs every rank's body on a simulated job, in virtual time: each round
/// polls every unfinished body; a round in which no rank found work moves
/// the clock to the next scheduled event or connection timer.
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
            job.refresh_timers();
            if !job.idle_advance() {
                // Nothing scheduled: let a millisecond pass.
                job.sim.advance(Duration::from_millis(1));
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
    let stream = if server {
        let l = TcpListener::bind(("0.0.0.0", port)).map_err(io)?;
        l.accept().map_err(io)?.0
    } else {
        let end = Instant::now() + timeout;
        loop {
            match TcpStream::connect((host, port)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= end => return Err(io(e)),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let mut w = stream.try_clone().map_err(io)?;
    let receive = me.receive.map_or("-".to_string(), |r| r.to_string());
    let ib = me.ib.map_or("-".to_string(), |a| a.to_string());
    writeln!(
        w,
        "xrcbtl-osu 2 {} {} {} {receive} {ib}",
        me.rank, me.node, me.addr
    )
    .map_err(io)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).map_err(io)?;
    parse_peer(&line)
        .ok_or_else(|| Error::invalid(format!("out-of-band exchange: bad line {line:?}")))
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
}
