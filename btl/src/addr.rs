//! The address a rank publishes for its peers (through the MPI library's
//! out-of-band exchange: PMIx, a file, a socket) and what a peer makes of
//! it.
//!
//! Layout, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `XRCB` |
//! | 1 | version (2) |
//! | 4 | rank |
//! | 1 | address family (4 or 6) |
//! | 4 or 16 | listener IP |
//! | 2 | listener port |
//! | 1 | node key length n (1..=255) |
//! | n | node key (UTF-8) |
//! | 1 | how the rank receives: 0 RC, 1 XRC |
//! | 8 + 8 | XRC only: its domain's key file, `st_dev` and `st_ino` |
//! | 1 | 1 if a native InfiniBand listener follows, else 0 |
//! | 16 + 2 + 2 | that listener: GID, P_Key, port (peers that can use `AF_IB` reach it by GID, with no ARP) |
//!
//! The node key says which ranks share a node's XRC domain and receive
//! through one XRC INI QP from each sender: ranks of one host on one
//! device (`hostname/device`), or a simulated node (`sim/N`). Node numbers
//! are local to each rank (they never travel), so the key is the node's
//! identity. The way the rank receives lets peers refuse what cannot work
//! (XRC against RC, or two XRC domains on one node) with a clear error.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

use xrcbtl_fabric::{Gid, IbAddr, XrcdId};
use xrcbtl_xrc_conn::Node;

use crate::types::{Peer, Receive};

const MAGIC: &[u8; 4] = b"XRCB";
const VERSION: u8 = 2;

/// Longest encoded address.
pub const MAX_LEN: usize = 4 + 1 + 4 + 1 + 16 + 2 + 1 + 255 + 1 + 16 + 1 + 20;

/// A rank's published address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The rank.
    pub rank: u32,
    /// Its connection listener.
    pub listen: SocketAddr,
    /// Which node it is on (see the module docs).
    pub node_key: String,
    /// How it receives: RC, or XRC through which domain.
    pub receive: Receive,
    /// Its native InfiniBand listener, if it has one.
    pub ib: Option<IbAddr>,
}

impl Address {
    /// The bytes to publish; `None` if the node key is empty or longer
    /// than 255 bytes.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let key = self.node_key.as_bytes();
        if key.is_empty() || key.len() > 255 {
            return None;
        }
        let mut b = Vec::with_capacity(MAX_LEN);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.rank.to_le_bytes());
        match self.listen.ip() {
            IpAddr::V4(a) => {
                b.push(4);
                b.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b.push(6);
                b.extend_from_slice(&a.octets());
            }
        }
        b.extend_from_slice(&self.listen.port().to_le_bytes());
        b.push(key.len() as u8);
        b.extend_from_slice(key);
        match self.receive {
            Receive::Rc => b.push(0),
            Receive::Xrc(x) => {
                b.push(1);
                b.extend_from_slice(&x.dev.to_le_bytes());
                b.extend_from_slice(&x.ino.to_le_bytes());
            }
        }
        match self.ib {
            None => b.push(0),
            Some(a) => {
                b.push(1);
                b.extend_from_slice(&a.gid.0);
                b.extend_from_slice(&a.pkey.to_le_bytes());
                b.extend_from_slice(&a.port.to_le_bytes());
            }
        }
        Some(b)
    }

    /// Reads an address; the reason it is refused otherwise. Every byte
    /// must be accounted for.
    pub fn decode(b: &[u8]) -> Result<Address, String> {
        let mut r = Reader(b);
        if r.take(4)? != MAGIC {
            return Err("not an xrcbtl address (bad magic)".into());
        }
        let v = r.take(1)?[0];
        if v != VERSION {
            return Err(format!("address version {v}, this library reads {VERSION}"));
        }
        let rank = u32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes"));
        let ip = match r.take(1)?[0] {
            4 => IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(r.take(4)?).expect("4 bytes"),
            )),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(r.take(16)?).expect("16 bytes"),
            )),
            f => return Err(format!("unknown address family {f}")),
        };
        let port = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"));
        let n = r.take(1)?[0] as usize;
        if n == 0 {
            return Err("empty node key".into());
        }
        let node_key = std::str::from_utf8(r.take(n)?)
            .map_err(|_| "node key is not UTF-8".to_string())?
            .to_string();
        let receive = match r.take(1)?[0] {
            0 => Receive::Rc,
            1 => {
                let mut word = || -> Result<u64, String> {
                    Ok(u64::from_le_bytes(r.take(8)?.try_into().expect("8 bytes")))
                };
                let dev = word()?;
                let ino = word()?;
                Receive::Xrc(XrcdId { dev, ino })
            }
            k => return Err(format!("unknown way of receiving {k}")),
        };
        let ib = match r.take(1)?[0] {
            0 => None,
            1 => {
                let gid = Gid(r.take(16)?.try_into().expect("16 bytes"));
                let pkey = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"));
                let port = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"));
                Some(IbAddr { gid, pkey, port })
            }
            k => return Err(format!("unknown InfiniBand address flag {k}")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the address", r.0.len()));
        }
        Ok(Address {
            rank,
            listen: SocketAddr::new(ip, port),
            node_key,
            receive,
            ib,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("address cut short".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

/// A job's number for the connection handshake, from its name (FNV-1a):
/// a rank refuses requests that carry another job's number.
pub fn job_number(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The numbers a rank gives the nodes it hears of, by node key: its own
/// node's first, a simulated node (`sim/N`, as its job numbered it) its
/// own number when the rank is simulated too, any other key the next free
/// number the first time it is seen. Safe to share between threads.
#[derive(Debug)]
pub struct NodeNumbers {
    in_sim: bool,
    nodes: Mutex<HashMap<String, Node>>,
}

impl NodeNumbers {
    /// The numbers of a rank whose own node is `own_key`, numbered `own`.
    pub fn new(own_key: &str, own: Node, in_sim: bool) -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(own_key.to_string(), own);
        NodeNumbers {
            in_sim,
            nodes: Mutex::new(nodes),
        }
    }

    /// The number of a node key.
    pub fn of(&self, key: &str) -> Node {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&n) = nodes.get(key) {
            return n;
        }
        let n = match key.strip_prefix("sim/").and_then(|n| n.parse().ok()) {
            Some(n) if self.in_sim => n,
            _ => nodes.values().max().map_or(0, |m| m + 1),
        };
        nodes.insert(key.to_string(), n);
        n
    }
}

impl Address {
    /// The peer this address describes, its node numbered by `nodes`.
    pub fn to_peer(&self, nodes: &NodeNumbers) -> Peer {
        Peer {
            rank: self.rank,
            node: nodes.of(&self.node_key),
            addr: self.listen,
            ib: self.ib,
            receive: Some(self.receive),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_numbers_differ_by_name() {
        assert_ne!(job_number("a"), job_number("b"));
        assert_eq!(job_number("job-1"), job_number("job-1"));
    }

    #[test]
    fn nodes_are_numbered_by_key() {
        let sim = NodeNumbers::new("sim/0", 0, true);
        assert_eq!(sim.of("sim/0"), 0);
        assert_eq!(sim.of("sim/5"), 5, "simulated nodes keep their number");
        assert_eq!(sim.of("host/10.0.0.1"), 6);
        assert_eq!(sim.of("host/10.0.0.2"), 7);
        assert_eq!(sim.of("host/10.0.0.1"), 6, "one key, one number");
        let real = NodeNumbers::new("host/a", 0, false);
        assert_eq!(real.of("sim/5"), 1, "only a simulated rank reads sim/N");
    }

    #[test]
    fn addresses_round_trip_and_every_cut_is_refused() {
        let xrc = Receive::Xrc(XrcdId {
            dev: 0x0102_0304_0506_0708,
            ino: 42,
        });
        let ib = Some(IbAddr {
            gid: Gid([
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0xa1, 0xb2, 0xc3,
            ]),
            pkey: 0xffff,
            port: 4791,
        });
        for (listen, receive, ib) in [
            ("10.0.2.15:4791", xrc, ib),
            ("[fe80::1]:17", Receive::Rc, None),
        ] {
            let a = Address {
                rank: 0x0102_0304,
                listen: listen.parse().unwrap(),
                node_key: "vm/rxe0".into(),
                receive,
                ib,
            };
            let b = a.encode().unwrap();
            assert!(b.len() <= MAX_LEN);
            assert_eq!(Address::decode(&b).unwrap(), a);
            for cut in 0..b.len() {
                assert!(Address::decode(&b[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Address::decode(&long).is_err(), "trailing byte");
            let mut bad = b.clone();
            bad[4] = 1;
            assert!(Address::decode(&bad).unwrap_err().contains("version"));
            bad = b.clone();
            bad[0] = b'Y';
            assert!(Address::decode(&bad).unwrap_err().contains("magic"));
            bad = b.clone();
            let at = 4 + 1 + 4 + 1 + if listen.starts_with('[') { 16 } else { 4 } + 2 + 1 + 7;
            bad[at] = 9;
            assert!(Address::decode(&bad).unwrap_err().contains("receiving"));
        }
    }

    #[test]
    fn node_keys_must_fit() {
        let mut a = Address {
            rank: 1,
            listen: "1.2.3.4:5".parse().unwrap(),
            node_key: String::new(),
            receive: Receive::Xrc(XrcdId { dev: 1, ino: 2 }),
            ib: Some(IbAddr {
                gid: Gid([1; 16]),
                pkey: 0x7fff,
                port: 1,
            }),
        };
        assert!(a.encode().is_none());
        a.node_key = "k".repeat(256);
        assert!(a.encode().is_none());
        a.node_key = "k".repeat(255);
        assert_eq!(a.encode().unwrap().len(), MAX_LEN - 12);
    }
}
