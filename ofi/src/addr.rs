//! A provider endpoint's address, as `fi_getname` returns it and
//! `fi_av_insert` takes it (FI_FORMAT_UNSPEC: opaque bytes the caller
//! exchanges out of band).
//!
//! It has one length, 64 bytes, whatever the endpoint: Open MPI's mtl/ofi
//! and btl/ofi read their own name into a `char[FI_NAME_MAX]` (64), and
//! MPICH gives every peer's address the length of its own. So it cannot
//! carry the BTL's address ([`xrcbtl_btl::addr::Address`], with a node key
//! of up to 255 bytes) as is; it carries what a peer needs of it, and a
//! domain's node is its listener's IP address ([`EpAddr::node_key`]).
//!
//! Layout, little-endian:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | magic `X` |
//! | 1 | 1 | version (1) |
//! | 2 | 1 | flags: 1 IPv6 listener, 2 receives through XRC, 4 has an InfiniBand listener, 8 how it receives is not known |
//! | 3 | 1 | zero |
//! | 4 | 4 | the domain's rank |
//! | 8 | 2 | the endpoint's number in its domain |
//! | 10 | 2 | listener port |
//! | 12 | 16 | listener IP (IPv4: 4 bytes, then zeros) |
//! | 28 | 8 + 8 | XRC only: its domain's key file, `st_dev` and `st_ino` (else zeros) |
//! | 44 | 16 + 2 + 2 | with flag 4: the InfiniBand listener's GID, P_Key and port (else zeros) |
//!
//! Decoding is strict: another length, magic or version, an unknown flag,
//! or a byte that must be zero and is not, is refused with the reason, and
//! `fi_av_insert` fails that entry.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use xrcbtl_btl::addr::{Address, NodeNumbers};
use xrcbtl_btl::Peer;
use xrcbtl_btl::{IbAddr, Receive, XrcdId};
use xrcbtl_fabric::Gid;

/// The length of every address.
pub const LEN: usize = 64;
const MAGIC: u8 = b'X';
/// The version this provider writes and reads.
pub const VERSION: u8 = 1;

const V6: u8 = 1;
const XRC: u8 = 2;
const IB: u8 = 4;
const UNKNOWN: u8 = 8;

/// The rank of a verbs domain listening at `ip`:`port` (see
/// [`crate::host`]): the low 16 bits of the IPv4 address, then the port;
/// `None` for IPv6 (the rank must fit 32 bits).
pub fn rank_of(ip: IpAddr, port: u16) -> Option<u32> {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            Some((u32::from(u16::from_be_bytes([o[2], o[3]])) << 16) | u32::from(port))
        }
        IpAddr::V6(_) => None,
    }
}

/// A peer endpoint as messages name it: its domain's rank and its number
/// there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerEp {
    /// The peer's domain: its BTL rank.
    pub domain: u32,
    /// The endpoint in that domain.
    pub ep: u16,
}

/// An endpoint's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpAddr {
    /// Its domain's rank.
    pub rank: u32,
    /// The endpoint's number in its domain.
    pub ep: u16,
    /// Its domain's connection listener.
    pub listen: SocketAddr,
    /// How its domain receives; `None` where that is not known (an
    /// address `fi_getinfo` made from a node and a service, before the
    /// listener there existed: [`EpAddr::template`]).
    pub receive: Option<Receive>,
    /// Its domain's native InfiniBand listener, if it has one.
    pub ib: Option<IbAddr>,
}

impl EpAddr {
    /// Endpoint `ep` of the domain whose BTL publishes `domain`.
    pub fn of(domain: &Address, ep: u16) -> EpAddr {
        EpAddr {
            rank: domain.rank,
            ep,
            listen: domain.listen,
            receive: Some(domain.receive),
            ib: domain.ib,
        }
    }

    /// What `fi_getinfo` returns as an `src_addr` or `dest_addr` for
    /// the listener `ip`:`port` before any domain exists there: the
    /// address of that listener's first endpoint as far as it can be known
    /// (its rank per [`rank_of`]; how it receives not known: a domain's
    /// real address, from `fi_getname`, is what peers insert).
    pub fn template(ip: IpAddr, port: u16) -> EpAddr {
        EpAddr {
            rank: rank_of(ip, port).unwrap_or(0),
            ep: 0,
            listen: SocketAddr::new(ip, port),
            receive: None,
            ib: None,
        }
    }

    /// The endpoint as messages name it.
    pub fn peer(&self) -> PeerEp {
        PeerEp {
            domain: self.rank,
            ep: self.ep,
        }
    }

    /// The node key of a provider domain: its listener's IP address (the
    /// ranks of a host on one device listen on its one address).
    pub fn node_key(ip: IpAddr) -> String {
        format!("ip/{ip}")
    }

    /// Its domain as the BTL's peer, its node numbered by `nodes` from
    /// [`EpAddr::node_key`]; how it receives is checked against the BTL's
    /// own only where the address says.
    pub fn btl_peer(&self, nodes: &NodeNumbers) -> Peer {
        Peer {
            rank: self.rank,
            node: nodes.of(&Self::node_key(self.listen.ip())),
            addr: self.listen,
            ib: self.ib,
            receive: self.receive,
        }
    }

    /// The bytes `fi_getname` returns.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        b[4..8].copy_from_slice(&self.rank.to_le_bytes());
        b[8..10].copy_from_slice(&self.ep.to_le_bytes());
        b[10..12].copy_from_slice(&self.listen.port().to_le_bytes());
        let mut flags = 0;
        match self.listen.ip() {
            IpAddr::V4(a) => b[12..16].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => {
                flags |= V6;
                b[12..28].copy_from_slice(&a.octets());
            }
        }
        if self.receive.is_none() {
            flags |= UNKNOWN;
        }
        if let Some(Receive::Xrc(id)) = self.receive {
            flags |= XRC;
            b[28..36].copy_from_slice(&id.dev.to_le_bytes());
            b[36..44].copy_from_slice(&id.ino.to_le_bytes());
        }
        if let Some(ib) = self.ib {
            flags |= IB;
            b[44..60].copy_from_slice(&ib.gid.0);
            b[60..62].copy_from_slice(&ib.pkey.to_le_bytes());
            b[62..64].copy_from_slice(&ib.port.to_le_bytes());
        }
        b[2] = flags;
        b
    }

    /// Reads an address a caller inserts, or says why it is not one.
    pub fn decode(b: &[u8]) -> Result<EpAddr, String> {
        if b.len() != LEN {
            return Err(format!(
                "{} bytes: an xrc provider address has {LEN}",
                b.len()
            ));
        }
        if b[0] != MAGIC {
            return Err("not an xrc provider address (bad magic)".into());
        }
        if b[1] != VERSION {
            return Err(format!(
                "provider address version {}, this provider reads {VERSION}",
                b[1]
            ));
        }
        let flags = b[2];
        if flags & !(V6 | XRC | IB | UNKNOWN) != 0 || b[3] != 0 {
            return Err(format!("unknown flags {flags:#x} or a reserved byte set"));
        }
        if flags & (XRC | UNKNOWN) == XRC | UNKNOWN {
            return Err("an address both receiving through XRC and not known to".into());
        }
        let zero = |r: std::ops::Range<usize>, what: &str| -> Result<(), String> {
            if b[r].iter().any(|&x| x != 0) {
                Err(format!("{what} bytes set in an address that has none"))
            } else {
                Ok(())
            }
        };
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let rank = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        let ep = u16_at(8);
        let port = u16_at(10);
        let ip = if flags & V6 != 0 {
            let o: [u8; 16] = b[12..28].try_into().expect("16 bytes");
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            zero(16..28, "IPv6")?;
            IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        };
        let receive = if flags & XRC != 0 {
            Some(Receive::Xrc(XrcdId {
                dev: u64_at(28),
                ino: u64_at(36),
            }))
        } else {
            zero(28..44, "XRC domain")?;
            (flags & UNKNOWN == 0).then_some(Receive::Rc)
        };
        let ib = if flags & IB != 0 {
            Some(IbAddr {
                gid: Gid(b[44..60].try_into().expect("16 bytes")),
                pkey: u16_at(60),
                port: u16_at(62),
            })
        } else {
            zero(44..64, "InfiniBand listener")?;
            None
        };
        Ok(EpAddr {
            rank,
            ep,
            listen: SocketAddr::new(ip, port),
            receive,
            ib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<EpAddr> {
        vec![
            EpAddr {
                rank: 0x0102_0304,
                ep: 3,
                listen: "10.0.0.7:4791".parse().unwrap(),
                receive: Some(Receive::Rc),
                ib: None,
            },
            EpAddr {
                rank: 7,
                ep: u16::MAX,
                listen: "[fe80::1]:17".parse().unwrap(),
                receive: Some(Receive::Xrc(XrcdId {
                    dev: 0x0102_0304_0506_0708,
                    ino: 42,
                })),
                ib: Some(IbAddr {
                    gid: Gid([
                        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 0xa1, 0xb2, 0xc3,
                    ]),
                    pkey: 0xffff,
                    port: 4791,
                }),
            },
        ]
    }

    #[test]
    fn every_address_round_trips_in_64_bytes() {
        for a in samples() {
            let b = a.encode();
            assert_eq!(b.len(), 64);
            assert_eq!(EpAddr::decode(&b).unwrap(), a);
            let nodes = NodeNumbers::new("ip/192.0.2.1", 0, false);
            let p = a.btl_peer(&nodes);
            assert_eq!(
                (p.rank, p.node, p.addr, p.receive),
                (a.rank, 1, a.listen, a.receive)
            );
        }
        // A template: how it receives is not known, and not checked.
        let t = EpAddr::template("10.0.2.15".parse().unwrap(), 9228);
        assert_eq!(EpAddr::decode(&t.encode()).unwrap(), t);
        assert_eq!(t.receive, None);
        let mut both = t.encode();
        both[2] |= XRC;
        assert!(EpAddr::decode(&both).unwrap_err().contains("not known"));
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let b = samples()[0].encode();
        assert!(EpAddr::decode(&b[..63]).unwrap_err().contains("has 64"));
        let mut longer = b.to_vec();
        longer.push(0);
        assert!(EpAddr::decode(&longer).unwrap_err().contains("has 64"));
        let set = |i: usize, v: u8| {
            let mut c = b;
            c[i] = v;
            EpAddr::decode(&c).unwrap_err()
        };
        assert!(set(0, b'Y').contains("magic"));
        assert!(set(1, 2).contains("version 2"));
        assert!(set(2, 16).contains("unknown flags"));
        assert!(set(3, 1).contains("reserved"));
        assert!(set(20, 1).contains("IPv6"));
        assert!(set(30, 1).contains("XRC"));
        assert!(set(50, 1).contains("InfiniBand"));
    }
}
