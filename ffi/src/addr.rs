//! The address a rank publishes for its peers (through the MPI library's
//! out-of-band exchange: PMIx, a file, a socket) and what a peer makes of
//! it.
//!
//! Layout, little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `XRCB` |
//! | 1 | version (1) |
//! | 4 | rank |
//! | 1 | address family (4 or 6) |
//! | 4 or 16 | listener IP |
//! | 2 | listener port |
//! | 1 | node key length n (1..=255) |
//! | n | node key (UTF-8) |
//!
//! The node key says which ranks share a node's XRC domain and receive
//! through one XRC INI QP from each sender: ranks of one host on one
//! device (`hostname/ip`), or a simulated node (`sim/N`). Node numbers
//! are local to each rank (they never travel), so the key is the node's
//! identity.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const MAGIC: &[u8; 4] = b"XRCB";
const VERSION: u8 = 1;

/// Longest encoded address.
pub(crate) const MAX_LEN: usize = 4 + 1 + 4 + 1 + 16 + 2 + 1 + 255;

/// A rank's published address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Address {
    pub rank: u32,
    pub listen: SocketAddr,
    pub node_key: String,
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
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the address", r.0.len()));
        }
        Ok(Address {
            rank,
            listen: SocketAddr::new(ip, port),
            node_key,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_every_cut_is_refused() {
        for listen in ["10.0.2.15:4791", "[fe80::1]:17"] {
            let a = Address {
                rank: 0x0102_0304,
                listen: listen.parse().unwrap(),
                node_key: "vm/10.0.2.15".into(),
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
            bad[4] = 2;
            assert!(Address::decode(&bad).unwrap_err().contains("version"));
            bad = b.clone();
            bad[0] = b'Y';
            assert!(Address::decode(&bad).unwrap_err().contains("magic"));
        }
    }

    #[test]
    fn node_keys_must_fit() {
        let mut a = Address {
            rank: 1,
            listen: "1.2.3.4:5".parse().unwrap(),
            node_key: String::new(),
        };
        assert!(a.encode().is_none());
        a.node_key = "k".repeat(256);
        assert!(a.encode().is_none());
        a.node_key = "k".repeat(255);
        assert_eq!(a.encode().unwrap().len(), MAX_LEN - 12);
    }
}
