//! A ring of values whose free places keep a value, so that the next one
//! can be written where it will stay.

use std::ops::{Index, Range};

/// A value a [`Ring`] keeps in its free places.
pub trait Spare {
    /// A value that holds nothing: written where a value that holds
    /// something was taken out.
    fn spare() -> Self;

    /// Whether this value holds nothing that must be freed, so that it may
    /// stay where it is once retired, until its place is written again.
    fn is_spare(&self) -> bool;
}

/// A double-ended queue, in order, whose places are never uninitialised:
/// a free place holds a spare value ([`Spare`]), or a retired one that
/// holds nothing. [`Ring::push_place`] hands out the next place as it is,
/// for the caller to fill field by field, so a large value is built where
/// it stays instead of on the stack and then moved (a `VecDeque` moves it
/// at least once). Retiring values that hold nothing
/// ([`Ring::retire_front`]) only moves the front.
///
/// The capacity is a power of two, or zero: a new ring holds no memory
/// until its first push.
pub struct Ring<T> {
    buf: Vec<T>,
    head: usize,
    len: usize,
}

impl<T> Default for Ring<T> {
    fn default() -> Self {
        Ring {
            buf: Vec::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.range(0..self.len)).finish()
    }
}

impl<T> Ring<T> {
    /// An empty ring, holding no memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Values in the ring.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the ring holds no value.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Places the ring holds memory for.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The place of the value at position `i` from the front.
    #[inline(always)]
    fn at(&self, i: usize) -> usize {
        (self.head + i) & (self.buf.len() - 1)
    }

    /// The value at position `i` from the front.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        (i < self.len).then(|| &self.buf[self.at(i)])
    }

    /// The front value.
    #[inline]
    pub fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// Where positions `r` lie in the buffer: two runs, the second one
    /// empty unless they wrap round its end.
    #[inline]
    fn runs(&self, r: Range<usize>) -> (Range<usize>, Range<usize>) {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "positions {r:?} of a ring of {}",
            self.len
        );
        let n = r.end - r.start;
        if n == 0 {
            return (0..0, 0..0);
        }
        let a = self.at(r.start);
        let first = n.min(self.buf.len() - a);
        (a..a + first, 0..n - first)
    }

    /// The values at positions `r`, front to back.
    pub fn range(&self, r: Range<usize>) -> impl DoubleEndedIterator<Item = &T> {
        let (a, b) = self.runs(r);
        self.buf[a].iter().chain(self.buf[b].iter())
    }

    /// The values at positions `r`, front to back, to change, as the two
    /// runs of the buffer they lie in (the second empty unless they wrap).
    pub fn runs_mut(&mut self, r: Range<usize>) -> (&mut [T], &mut [T]) {
        let (a, b) = self.runs(r);
        // The wrapped run lies wholly before the first one.
        let (low, high) = self.buf.split_at_mut(a.start);
        (&mut high[..a.len()], &mut low[b])
    }

    /// The values at positions `r`, front to back, to change.
    pub fn range_mut(&mut self, r: Range<usize>) -> impl DoubleEndedIterator<Item = &mut T> {
        let (a, b) = self.runs(r);
        // The wrapped run lies wholly before the first one.
        let (low, high) = self.buf.split_at_mut(a.start);
        high[..a.len()].iter_mut().chain(low[b].iter_mut())
    }
}

impl<T: Spare> Ring<T> {
    /// Doubles the capacity (to 1 from none: a ring per QP of a large job
    /// that carried one message holds one place), keeping the values in
    /// order from the buffer's start.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = (self.buf.len() * 2).max(1);
        let mut buf = Vec::with_capacity(cap);
        for i in 0..self.len {
            let at = self.at(i);
            buf.push(std::mem::replace(&mut self.buf[at], T::spare()));
        }
        buf.resize_with(cap, T::spare);
        self.buf = buf;
        self.head = 0;
    }

    /// Appends a place at the back and returns it, holding a spare or a
    /// retired value, for the caller to fill. Whatever it is left holding
    /// is the new back value.
    #[inline(always)]
    pub fn push_place(&mut self) -> &mut T {
        if self.len == self.buf.len() {
            self.grow();
        }
        let at = self.at(self.len);
        self.len += 1;
        &mut self.buf[at]
    }

    /// Appends `value` at the back.
    #[inline]
    pub fn push_back(&mut self, value: T) {
        *self.push_place() = value;
    }

    /// Takes out the front value.
    #[inline]
    pub fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let at = self.head;
        self.head = self.at(1);
        self.len -= 1;
        Some(std::mem::replace(&mut self.buf[at], T::spare()))
    }

    /// Takes out the back value.
    #[inline]
    pub fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let at = self.at(self.len);
        Some(std::mem::replace(&mut self.buf[at], T::spare()))
    }

    /// Drops the first `k` values: those that hold nothing stay where
    /// they are, the rest are freed now.
    #[inline]
    pub fn retire_front(&mut self, k: usize) {
        self.retire_front_while(k, |_| true);
    }

    /// Drops values from the front, at most `most` of them, for as long as
    /// `take` accepts them, in one walk: each that holds something is
    /// freed, the others stay where they are. Returns how many it dropped.
    #[inline]
    pub fn retire_front_while(&mut self, most: usize, take: impl Fn(&T) -> bool) -> usize {
        let (a, b) = self.runs(0..most);
        let mut k = 0;
        'runs: for run in [a, b] {
            for x in &mut self.buf[run] {
                if !take(x) {
                    break 'runs;
                }
                if !x.is_spare() {
                    *x = T::spare();
                }
                k += 1;
            }
        }
        if k > 0 {
            self.head = self.at(k);
            self.len -= k;
        }
        k
    }

    /// Drops the first `k` values, which the caller has left holding
    /// nothing ([`Spare::is_spare`]): only the front moves, with no walk
    /// over them (a value that holds something would stay alive in its
    /// free place until that place is written again).
    #[inline]
    pub fn skip_front(&mut self, k: usize) {
        assert!(
            k <= self.len,
            "skipping {k} values of a ring of {}",
            self.len
        );
        debug_assert!(self.range(0..k).all(Spare::is_spare));
        if k == 0 {
            return;
        }
        self.head = self.at(k);
        self.len -= k;
    }

    /// Takes out the value at position `i`. The values on its shorter side
    /// move one place to close the gap: taking out the front (or the back)
    /// moves none.
    pub fn remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        if i < self.len / 2 {
            // Those before it move back one, and it ends at the front.
            for j in (0..i).rev() {
                let (a, b) = (self.at(j), self.at(j + 1));
                self.buf.swap(a, b);
            }
            self.pop_front()
        } else {
            // Those after it move up one, and it ends at the back.
            for j in i..self.len - 1 {
                let (a, b) = (self.at(j), self.at(j + 1));
                self.buf.swap(a, b);
            }
            self.pop_back()
        }
    }
}

impl<T> Index<usize> for Ring<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        self.get(i).expect("a position in the ring")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A value that counts, through its owner, how many of it are alive
    /// and hold something.
    #[derive(Debug, PartialEq)]
    struct V(Option<Box<u32>>);

    impl Spare for V {
        fn spare() -> V {
            V(None)
        }
        fn is_spare(&self) -> bool {
            self.0.is_none()
        }
    }

    fn v(n: u32) -> V {
        V(Some(Box::new(n)))
    }

    fn values(r: &Ring<V>) -> Vec<u32> {
        r.range(0..r.len())
            .map(|x| **x.0.as_ref().unwrap())
            .collect()
    }

    /// Every operation, checked against a `VecDeque` through wraps, growth
    /// and retirements, from a fixed pseudo-random sequence.
    #[test]
    fn behaves_as_a_deque() {
        let mut ring = Ring::new();
        let mut model = VecDeque::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut wrapped = 0;
        for n in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 8 {
                0..=2 => {
                    ring.push_back(v(n));
                    model.push_back(n);
                }
                3 => {
                    *ring.push_place() = v(n);
                    model.push_back(n);
                }
                4 => assert_eq!(ring.pop_front().map(|x| *x.0.unwrap()), model.pop_front()),
                5 => assert_eq!(ring.pop_back().map(|x| *x.0.unwrap()), model.pop_back()),
                6 if x & (1 << 40) == 0 => {
                    let k = (x >> 8) as usize % (model.len() + 1);
                    ring.retire_front(k);
                    model.drain(..k);
                }
                6 => {
                    // At most `most`, up to the first multiple of 5.
                    let most = (x >> 8) as usize % (model.len() + 1);
                    let want = model.iter().take(most).take_while(|&&y| y % 5 != 0).count();
                    let k = ring.retire_front_while(most, |y| **y.0.as_ref().unwrap() % 5 != 0);
                    assert_eq!(k, want);
                    model.drain(..k);
                }
                _ => {
                    let i = (x >> 8) as usize % (model.len() + 1);
                    assert_eq!(ring.remove(i).map(|x| *x.0.unwrap()), model.remove(i));
                }
            }
            assert_eq!(ring.len(), model.len());
            assert_eq!(values(&ring), Vec::from(model.clone()));
            let cap = ring.capacity();
            assert!(cap == 0 || cap.is_power_of_two());
            if let Some(&last) = model.back() {
                let s = model.len() / 3;
                let back: Vec<u32> = ring
                    .range(s..model.len())
                    .rev()
                    .map(|x| **x.0.as_ref().unwrap())
                    .collect();
                assert_eq!(back[0], last);
                assert_eq!(back.len(), model.len() - s);
                for y in ring.range_mut(s..model.len()) {
                    **y.0.as_mut().unwrap() += 1;
                }
                for y in model.range_mut(s..) {
                    *y += 1;
                }
                assert_eq!(values(&ring), Vec::from(model.clone()));
                // The same positions as two runs of the buffer.
                let (a, b) = ring.runs_mut(s..model.len());
                assert_eq!(a.len() + b.len(), model.len() - s);
                assert!(b.is_empty() || !a.is_empty());
                wrapped += usize::from(!b.is_empty());
                for y in a.iter_mut().chain(b.iter_mut()) {
                    **y.0.as_mut().unwrap() += 1;
                }
                for y in model.range_mut(s..) {
                    *y += 1;
                }
                assert_eq!(values(&ring), Vec::from(model.clone()));
                assert_eq!(
                    ring.front().map(|x| **x.0.as_ref().unwrap()),
                    model.front().copied()
                );
                assert_eq!(ring[model.len() - 1].0.as_deref(), model.back());
            }
        }
        assert!(wrapped > 0, "no range wrapped round the buffer");
    }

    /// Retired values that hold something are freed at once; the places a
    /// ring hands out hold spare values until written.
    #[test]
    fn frees_what_it_retires() {
        let mut ring = Ring::new();
        assert_eq!(ring.capacity(), 0);
        for n in 0..3 {
            ring.push_back(v(n));
        }
        ring.push_back(V::spare());
        assert_eq!(ring.capacity(), 4);
        ring.retire_front(4);
        assert!(ring.is_empty());
        assert!(
            ring.buf.iter().all(Spare::is_spare),
            "nothing retired stays allocated"
        );
        assert_eq!(*ring.push_place(), V::spare());
        assert!(ring.get(1).is_none());
        assert_eq!(ring.range_mut(0..1).count(), 1);
    }

    /// A retirement while values pass stops at the first that does not,
    /// or at its bound, across the wrap; spare values pass through it.
    #[test]
    fn retires_a_front_while_it_passes() {
        let mut ring = Ring::new();
        for n in 0..3 {
            ring.push_back(v(n));
        }
        ring.retire_front(3);
        // The next values wrap round the buffer of four.
        for x in [v(1), V::spare(), v(2), v(10)] {
            ring.push_back(x);
        }
        let small = |x: &V| x.0.as_deref().is_none_or(|&n| n < 5);
        assert_eq!(ring.retire_front_while(2, small), 2);
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.retire_front_while(2, small), 1);
        assert_eq!(values(&ring), vec![10]);
        assert_eq!(ring.retire_front_while(1, small), 0);
        assert_eq!(ring.retire_front_while(0, |_| true), 0);
        assert_eq!(ring.retire_front_while(1, |_| true), 1);
        assert!(ring.is_empty());
    }

    #[test]
    fn skips_a_front_that_holds_nothing_across_the_wrap() {
        let mut ring = Ring::new();
        for n in 0..3 {
            ring.push_back(v(n));
        }
        ring.push_back(V::spare());
        // The spare alone is left, in the buffer's last place: what comes
        // next wraps round to its start.
        ring.retire_front(3);
        ring.push_back(V::spare());
        ring.push_back(v(9));
        assert_eq!((ring.len(), ring.capacity()), (3, 4));
        ring.skip_front(2);
        assert_eq!(ring.len(), 1);
        assert_eq!(ring.front(), Some(&v(9)));
        ring.skip_front(0);
        assert_eq!(ring.pop_front(), Some(v(9)));
        assert!(ring.is_empty());
    }

    #[test]
    #[should_panic(expected = "skipping 2 values")]
    fn refuses_to_skip_past_its_end() {
        let mut ring = Ring::new();
        ring.push_back(V::spare());
        ring.skip_front(2);
    }

    #[test]
    #[should_panic(expected = "positions")]
    fn refuses_a_range_past_its_end() {
        let ring: Ring<V> = Ring::new();
        let _ = ring.range(0..1).count();
    }
}
