//! RMA transfers and atomics as device operations on the BTL: a transfer is
//! cut where the target's chunks end ([`crate::keys`]) and where its local
//! side must be registered in more than one device region, each piece is a
//! BTL put (`put_landed`: done once its data has landed, on iWARP too) or
//! get, and the transfer is done when its last piece is.
//!
//! [`Lookups`] keeps a domain's compound keys, what peers answered about
//! theirs, and the work that waits for an answer.
#![forbid(unsafe_code)]

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use xrcbtl_btl::{Access, Btl, MemReg, RegMem, RemoteMem, UserMem};
use xrcbtl_fabric::Context;

use crate::keys::{self, Chunk, Piece, COMPOUND};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What reaches a target's memory: a device key, or a compound key's
/// chunks.
#[derive(Debug, Clone)]
pub enum Reach {
    /// One device region under this key.
    Device(u32),
    /// Several, as the key's owner answered.
    Chunks(Arc<Vec<Chunk>>),
    /// Nothing: the key's owner refused it, or could not be asked (why).
    Refused(String),
}

impl Reach {
    /// `len` bytes at `addr` as device operations on the target's side.
    pub fn pieces(&self, addr: u64, len: u64) -> Result<Vec<Piece>, String> {
        match self {
            Reach::Device(rkey) => Ok(vec![Piece {
                offset: 0,
                addr,
                len,
                rkey: *rkey,
            }]),
            Reach::Chunks(c) => keys::pieces(c, addr, len),
            Reach::Refused(why) => Err(why.clone()),
        }
    }
}

/// Cuts `pieces` further where the local side, `len` bytes at `local`, must
/// change device region (regions of at most `max` bytes).
pub fn cut_local(pieces: Vec<Piece>, local: u64, len: u64, max: u64) -> Vec<Piece> {
    if keys::fits(local, len, max) {
        return pieces;
    }
    // Offsets where the local side's regions end.
    let bounds: Vec<u64> = keys::cut(local, len, max)
        .iter()
        .map(|&(a, l)| a + l - local)
        .collect();
    let mut out = Vec::new();
    for p in pieces {
        let mut at = p.offset;
        let end = p.offset + p.len;
        let inner: Vec<u64> = bounds
            .iter()
            .copied()
            .filter(|&b| b > p.offset && b < end)
            .collect();
        for b in inner {
            out.push(Piece {
                offset: at,
                addr: p.addr + (at - p.offset),
                len: b - at,
                rkey: p.rkey,
            });
            at = b;
        }
        out.push(Piece {
            offset: at,
            addr: p.addr + (at - p.offset),
            len: end - at,
            rkey: p.rkey,
        });
    }
    out
}

/// The local side of a transfer.
pub enum Local<C: Context> {
    /// A copy the provider made (FI_INJECT), registered with it.
    Bounce(RegMem<C>),
    /// The caller's memory, registered piece by piece for the transfer.
    User(UserMem),
}

/// What runs once a transfer is over: whether every piece succeeded.
pub type After<C> = Box<dyn FnOnce(&Btl<C>, bool) + Send>;

/// One RMA read or write, ready to go once its target is reached.
pub struct Transfer<C: Context> {
    /// The target rank.
    pub to: u32,
    /// A write (else a read).
    pub write: bool,
    /// Whether the target's key lets this rank read it
    /// ([`crate::keys::READABLE`]).
    pub readable: bool,
    /// The local side.
    pub local: Local<C>,
    /// The target address.
    pub addr: u64,
    /// Bytes.
    pub len: usize,
    /// What runs at the end.
    pub after: After<C>,
}

struct Flight<C: Context> {
    left: usize,
    ok: bool,
    regs: Vec<MemReg>,
    bounce: Option<RegMem<C>>,
    after: Option<After<C>>,
}

/// Starts `t` through `reach`. Fails, giving its end back unrun, only when
/// no piece started; a piece that fails to start after another did fails
/// the transfer through its end.
pub fn start<C: Context>(
    btl: &Btl<C>,
    t: Transfer<C>,
    reach: &Reach,
) -> Result<(), (xrcbtl_fabric::Error, After<C>)> {
    let max = btl.caps().max_mr_size;
    let pieces = match reach.pieces(t.addr, t.len as u64) {
        Ok(p) => p,
        Err(why) => return Err((xrcbtl_fabric::Error::invalid(why), t.after)),
    };
    let (local_addr, user) = match &t.local {
        Local::Bounce(b) => (b.reg().addr(), None),
        Local::User(m) => (m.addr() as u64, Some(*m)),
    };
    let pieces = match user {
        Some(_) => cut_local(pieces, local_addr, t.len as u64, max),
        None => pieces,
    };
    // Local registrations first: nothing has started if one fails.
    let mut regs = Vec::with_capacity(pieces.len());
    if let Some(m) = user {
        for p in &pieces {
            let reg = m
                .slice(p.offset as usize, p.len as usize)
                .and_then(|s| btl.register_mem(s, Access::NONE));
            match reg {
                Ok(r) => regs.push(r),
                Err(e) => {
                    for r in regs {
                        let _ = btl.deregister_mem(r);
                    }
                    return Err((e, t.after));
                }
            }
        }
    }
    let Transfer {
        to,
        write,
        readable,
        local,
        after,
        ..
    } = t;
    let bounce = match local {
        Local::Bounce(b) => Some(b),
        Local::User(_) => None,
    };
    let locals: Vec<xrcbtl_btl::LocalPtr> = match &bounce {
        Some(b) => pieces.iter().map(|p| b.reg().at(p.offset)).collect(),
        None => regs.iter().map(|r| r.at(0)).collect(),
    };
    let flight = Arc::new(Mutex::new(Flight {
        left: pieces.len(),
        ok: true,
        regs,
        bounce,
        after: Some(after),
    }));
    for (i, p) in pieces.iter().enumerate() {
        let remote = RemoteMem {
            addr: p.addr,
            len: p.len,
            rkey: p.rkey,
        }
        .at(0);
        let f = flight.clone();
        let done = Box::new(move |btl: &Btl<C>, _, r: xrcbtl_btl::OpResult| {
            landed(btl, &f, 1, r.is_ok());
        });
        let r = if write {
            btl.put_landed(to, locals[i], remote, p.len as usize, readable, Some(done))
        } else {
            btl.get(to, remote, locals[i], p.len as usize, Some(done))
        };
        if let Err(e) = r {
            if i == 0 {
                let (regs, after) = {
                    let mut fl = lock(&flight);
                    (std::mem::take(&mut fl.regs), fl.after.take())
                };
                for r in regs {
                    let _ = btl.deregister_mem(r);
                }
                return Err((e, after.expect("not run")));
            }
            // The rest never start: the transfer fails once those that
            // did are over.
            landed(btl, &flight, pieces.len() - i, false);
            break;
        }
    }
    Ok(())
}

/// `n` pieces of a transfer are over; the last runs its end.
fn landed<C: Context>(btl: &Btl<C>, f: &Mutex<Flight<C>>, n: usize, ok: bool) {
    let (regs, bounce, after, ok) = {
        let mut fl = lock(f);
        fl.left -= n;
        fl.ok &= ok;
        if fl.left > 0 {
            return;
        }
        (
            std::mem::take(&mut fl.regs),
            fl.bounce.take(),
            fl.after.take(),
            fl.ok,
        )
    };
    for r in regs {
        let _ = btl.deregister_mem(r);
    }
    drop(bounce);
    if let Some(after) = after {
        after(btl, ok);
    }
}

/// Work waiting for a peer's answer about a compound key.
pub type Waiter<C> = Box<dyn FnOnce(&Btl<C>, Result<Reach, String>) + Send>;

/// A domain's compound keys and what it learnt of its peers'.
pub struct Lookups<C: Context> {
    next: u64,
    mine: FxHashMap<u64, Arc<Vec<Chunk>>>,
    theirs: FxHashMap<(u32, u64), Arc<Vec<Chunk>>>,
    waiting: FxHashMap<(u32, u64), Vec<Waiter<C>>>,
}

impl<C: Context> Default for Lookups<C> {
    fn default() -> Self {
        Lookups {
            next: 1,
            mine: FxHashMap::default(),
            theirs: FxHashMap::default(),
            waiting: FxHashMap::default(),
        }
    }
}

impl<C: Context> Lookups<C> {
    /// A new compound key for `chunks`.
    pub fn add(&mut self, chunks: Vec<Chunk>) -> u64 {
        let key = COMPOUND | self.next;
        self.next += 1;
        self.mine.insert(key, Arc::new(chunks));
        key
    }

    /// Forgets compound key `key` (its registration is closed).
    pub fn remove(&mut self, key: u64) {
        self.mine.remove(&key);
    }

    /// The chunks of this domain's key `key`.
    pub fn mine(&self, key: u64) -> Option<Arc<Vec<Chunk>>> {
        self.mine.get(&key).cloned()
    }

    /// What rank `to` answered about its compound key `key`, if it has.
    pub fn known(&self, to: u32, key: u64) -> Option<Reach> {
        self.theirs
            .get(&(to, key))
            .map(|c| Reach::Chunks(c.clone()))
    }

    /// Keys asked about and not yet answered.
    pub fn asked(&self) -> usize {
        self.waiting.len()
    }

    /// Keeps `waiter` until rank `to` answers about `key`; true when it is
    /// the first to wait (the caller asks).
    pub fn wait(&mut self, to: u32, key: u64, waiter: Waiter<C>) -> bool {
        let list = self.waiting.entry((to, key)).or_default();
        list.push(waiter);
        list.len() == 1
    }

    /// Rank `from` answered about `key` (or could not be asked): the
    /// answer is kept if it is one, and the waiting work is handed back.
    pub fn answer(
        &mut self,
        from: u32,
        key: u64,
        chunks: Result<Vec<Chunk>, String>,
    ) -> (Vec<Waiter<C>>, Result<Reach, String>) {
        let waiters = self.waiting.remove(&(from, key)).unwrap_or_default();
        let r = chunks.map(|c| {
            let c = Arc::new(c);
            self.theirs.insert((from, key), c.clone());
            Reach::Chunks(c)
        });
        (waiters, r)
    }

    /// Rank `rank` is gone: what was learnt of it is forgotten, and the
    /// work waiting on it handed back.
    pub fn lost(&mut self, rank: u32) -> Vec<Waiter<C>> {
        self.theirs.retain(|&(r, _), _| r != rank);
        let keys: Vec<(u32, u64)> = self
            .waiting
            .keys()
            .filter(|&&(r, _)| r == rank)
            .copied()
            .collect();
        keys.into_iter()
            .flat_map(|k| self.waiting.remove(&k).unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_cuts_split_pieces_where_the_local_side_changes_region() {
        let max = 4 * keys::PAGE;
        let pieces = vec![
            Piece {
                offset: 0,
                addr: 0x10_0000,
                len: 3 * keys::PAGE,
                rkey: 1,
            },
            Piece {
                offset: 3 * keys::PAGE,
                addr: 0x10_0000 + 3 * keys::PAGE,
                len: 5 * keys::PAGE,
                rkey: 2,
            },
        ];
        // A local buffer starting mid-page: its regions end at 0x4000 and
        // 0x8000 past the page it starts in.
        let local = 0x2_0800;
        let out = cut_local(pieces.clone(), local, 8 * keys::PAGE, max);
        let mut at = 0;
        for p in &out {
            assert_eq!(p.offset, at, "contiguous");
            assert!(keys::fits(local + p.offset, p.len, max), "{p:?}");
            let whole = pieces
                .iter()
                .find(|w| w.offset <= p.offset && p.offset + p.len <= w.offset + w.len)
                .expect("inside one remote piece");
            assert_eq!(p.rkey, whole.rkey);
            assert_eq!(p.addr - whole.addr, p.offset - whole.offset);
            at += p.len;
        }
        assert_eq!(at, 8 * keys::PAGE);
        assert!(out.len() > pieces.len());
        // Fits locally: unchanged.
        assert_eq!(cut_local(pieces.clone(), 0x1000, keys::PAGE, max), pieces);
    }
}
