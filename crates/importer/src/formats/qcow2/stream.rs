//! qcow2 to raw from a stream read once, in order (an upload, a compressed download, a server
//! without ranges), with no scratch copy.
//!
//! What a cluster holds is known from the tables that came before it: the header places the L1
//! table, the L1 table the L2 tables, the L2 tables the data. qemu writes each L2 table before
//! the data it maps, so nearly every cluster is known when it arrives and goes straight to the
//! target. A cluster that arrives before the table that places it (a refcount block, data in
//! front of an L1 table moved to the end by a resize, the shared tail of packed compressed
//! clusters) is held until the tables are complete, up to [`Tuning::stream_hold`] bytes with
//! everything else kept for the stream. An image that needs more, or maps data onto bytes the
//! stream has already passed, is [`ImportError::NotStreamable`]: it goes through scratch and
//! is converted at random, so the result never depends on the path.
//!
//! Every check of the random-access conversion holds here too; the ones that need the file's
//! length are made once the stream has ended.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::convert::{Tuning, fit};
use crate::error::ImportError;
use crate::formats::qcow2::convert::Inflater;
// Entries are checked against `OPEN_END` while the real length is unknown: past every offset a
// table can hold, so only the checks made at the end can refuse on length.
use crate::formats::qcow2::{self, Cluster, Header, OPEN_END, Qcow2Error};
use crate::reading::read_full;
use crate::task::blocking;
use crate::writer::{Op, Target, TargetKind, WriteStats, stopped};

/// What one entry of the maps below costs in memory, roughly (key, value, tree overhead).
const ENTRY_COST: u64 = 64;
/// The largest refcount table read to know the refcount blocks (which are then not held); a
/// larger one is passed over, and its blocks are held like any cluster not yet placed.
const MAX_REFCOUNT_TABLE: u64 = 4 << 20;
/// Writes gathered before they are sent to the writer.
const OPS_BYTES: u64 = 4 << 20;

/// Convert the qcow2 image `stream` holds (from its first byte) into `target`, refusing one
/// larger than `limit`; `context` names the stream in messages. Returns the virtual size and
/// what was written.
pub(crate) async fn convert(
    mut stream: Box<dyn Read + Send>,
    target: &Target,
    limit: Option<u64>,
    tuning: Tuning,
    context: &'static str,
) -> Result<(u64, WriteStats), ImportError> {
    let (header, first, stream) = blocking(move || {
        let mut head = vec![0u8; 4096];
        let n =
            read_full(&mut stream, &mut head).map_err(|e| ImportError::from_read(context, e))?;
        head.truncate(n);
        let cs = qcow2::header_read_len(&head, OPEN_END)?;
        let block = block_len(cs);
        let mut first = head;
        first.resize(block as usize, 0);
        let more = read_full(&mut stream, &mut first[n..])
            .map_err(|e| ImportError::from_read(context, e))?;
        first.truncate(n + more);
        // A stream shorter than a cluster is the whole image.
        let file_len = if first.len() < cs as usize {
            first.len() as u64
        } else {
            OPEN_END
        };
        let header = qcow2::parse_header(&first, file_len)?;
        Ok((header, Bytes::from(first), stream))
    })
    .await?;
    fit(target, header.virtual_size, limit)?;
    let writer = target.writer(tuning.parallel, tuning.writeback_window)?;
    let tx = writer.sender();
    let zero_fill = target.kind() == TargetKind::Block;
    // Nothing past what the target holds, and what the spool would allow, is read.
    let bound = limit
        .map(|l| l.saturating_add(l / 8).saturating_add(64 << 20))
        .unwrap_or(u64::MAX);
    let virtual_size = header.virtual_size;
    let done = blocking(move || {
        let mut s = Streamer::new(header, tx, zero_fill, tuning.stream_hold);
        s.refcount_table(&first);
        s.run(stream, first, bound, context)
    })
    .await;
    writer.finish_after(done.map(|()| virtual_size)).await
}

/// How much is read at once: a whole number of clusters, about a megabyte.
fn block_len(cluster_size: u64) -> u64 {
    cluster_size.max(1 << 20)
}

/// A data or compressed cluster whose bytes have not arrived yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Data,
    /// Compressed, this many bytes stored.
    Compressed(u64),
}

/// A cluster kept because a table still to come may place data in it.
struct Held {
    data: Bytes,
    /// The parts already used, as absolute ranges: once they cover it, it goes.
    used: Vec<(u64, u64)>,
}

/// A compressed cluster whose stored bytes run on into clusters still to come.
struct Partial {
    guest: u64,
    host: u64,
    len: u64,
    bytes: Vec<u8>,
}

struct Streamer {
    header: Header,
    cs: u64,
    tx: mpsc::Sender<Op>,
    zero_fill: bool,
    hold_limit: u64,
    /// Where the L1 table's entries the image uses end.
    l1_end: u64,
    /// The L1 table's bytes as they arrive, until it is whole.
    l1: Vec<u8>,
    l1_read: bool,
    /// L2 tables still to come: host offset → the L1 indices that name it; and how many
    /// indices that is.
    tables: BTreeMap<u64, Vec<u64>>,
    table_refs: u64,
    /// Clusters still to come: (host offset, guest offset) → what is stored there.
    needs: BTreeMap<(u64, u64), Need>,
    held: BTreeMap<u64, Held>,
    held_bytes: u64,
    /// Held clusters that may have become used up: more of them was placed, or they were kept
    /// only for the sector before the frontier. Only these are looked at again.
    touched: BTreeSet<u64>,
    /// Where the refcount table is, its bytes as they arrive, and the refcount blocks it names:
    /// refcounts are not needed for the conversion, so those clusters are never held.
    refcounts: std::ops::Range<u64>,
    refcount_bytes: Vec<u8>,
    refblocks: BTreeSet<u64>,
    /// The end of the last compressed cluster placed so far. Its stored length is rounded up
    /// to a sector, so the last sector before it may also hold the start of a compressed
    /// cluster that a table still to come places (qemu packs them): that sector is kept.
    frontier: u64,
    partials: Vec<Partial>,
    inflater: Option<Inflater>,
    /// Writes gathered for one send, and their bytes.
    ops: Vec<Op>,
    ops_bytes: u64,
    zero_run: Option<(u64, u64)>,
}

impl Streamer {
    fn new(header: Header, tx: mpsc::Sender<Op>, zero_fill: bool, hold_limit: u64) -> Streamer {
        let cs = header.cluster_size();
        let needed = header.virtual_size.div_ceil(header.l2_span());
        let l1_end = header.l1_table_offset + needed * 8;
        Streamer {
            cs,
            tx,
            zero_fill,
            hold_limit,
            l1_end,
            l1: Vec::new(),
            l1_read: needed == 0,
            tables: BTreeMap::new(),
            table_refs: 0,
            needs: BTreeMap::new(),
            held: BTreeMap::new(),
            held_bytes: 0,
            touched: BTreeSet::new(),
            frontier: 0,
            refcounts: 0..0,
            refcount_bytes: Vec::new(),
            refblocks: BTreeSet::new(),
            partials: Vec::new(),
            inflater: None,
            ops: Vec::new(),
            ops_bytes: 0,
            zero_run: None,
            header,
        }
    }

    /// Note where the refcount table is, from the header in `first` (checked only as far as
    /// this use needs: nothing is read from it that the conversion depends on).
    fn refcount_table(&mut self, first: &[u8]) {
        if first.len() < 60 {
            return;
        }
        let offset = u64::from_be_bytes(first[48..56].try_into().expect("8 bytes"));
        let clusters = u32::from_be_bytes(first[56..60].try_into().expect("4 bytes")) as u64;
        let len = clusters * self.cs;
        if offset >= self.cs
            && offset.is_multiple_of(self.cs)
            && len <= MAX_REFCOUNT_TABLE
            && let Some(end) = offset.checked_add(len)
        {
            self.refcounts = offset..end;
        }
    }

    /// Every table has been read: nothing still to come can place a cluster already passed.
    fn mapped(&self) -> bool {
        self.l1_read && self.tables.is_empty()
    }

    fn run(
        &mut self,
        mut stream: Box<dyn Read + Send>,
        first: Bytes,
        bound: u64,
        context: &str,
    ) -> Result<(), ImportError> {
        let block = block_len(self.cs) as usize;
        let mut at = 0u64;
        let mut data = first;
        loop {
            if data.is_empty() {
                break;
            }
            let short = data.len() < block;
            let mut p = 0usize;
            while p < data.len() {
                let end = (p + self.cs as usize).min(data.len());
                self.cluster(at + p as u64, data.slice(p..end))?;
                p = end;
            }
            at += data.len() as u64;
            self.flush()?;
            if short {
                break;
            }
            if at > bound {
                return Err(ImportError::Damaged(format!(
                    "the source expands past {bound} bytes, more than the target can hold"
                )));
            }
            let mut next = vec![0u8; block];
            let n = read_full(&mut stream, &mut next)
                .map_err(|e| ImportError::from_read(context, e))?;
            next.truncate(n);
            data = Bytes::from(next);
        }
        self.finish(at)
    }

    /// One cluster of the stream at host offset `p` (shorter than a cluster only at the end).
    fn cluster(&mut self, p: u64, c: Bytes) -> Result<(), ImportError> {
        let end = p + c.len() as u64;
        let mut used: Vec<(u64, u64)> = Vec::new();
        if p == 0 {
            used.push((p, end));
        }
        // Compressed clusters that began in earlier clusters, before the tables here add ones
        // that already hold this cluster's bytes.
        for mut partial in std::mem::take(&mut self.partials) {
            let want = (partial.host + partial.len - p).min(c.len() as u64);
            partial.bytes.extend_from_slice(&c[..want as usize]);
            used.push((p, p + want));
            if p + want == partial.host + partial.len {
                self.inflate(partial.guest, partial.host, &partial.bytes)?;
            } else {
                self.partials.push(partial);
            }
        }
        // The L1 table (its last cluster whole: the rest of it is unused entries).
        let l1_start = self.header.l1_table_offset;
        if !self.l1_read && p < self.l1_end && end > l1_start {
            let from = l1_start.max(p);
            let to = self.l1_end.min(end);
            self.l1
                .extend_from_slice(&c[(from - p) as usize..(to - p) as usize]);
            used.push((p, end));
            if to == self.l1_end {
                self.l1_read = true;
                self.read_l1(p, &c)?;
            }
        }
        if self.refcounts.contains(&p) {
            self.refcount_bytes.extend_from_slice(&c);
            used.push((p, end));
            if end >= self.refcounts.end {
                let table = std::mem::take(&mut self.refcount_bytes);
                self.refblocks.extend(
                    qcow2::entries(&table)
                        .map(|e| e & !(self.cs - 1))
                        .filter(|&o| o != 0),
                );
                self.drop_refblocks();
            }
        }
        if self.refblocks.contains(&p) {
            used.push((p, end));
        }
        if let Some(indices) = self.tables.remove(&p) {
            self.table_refs -= indices.len() as u64;
            if (c.len() as u64) < self.cs {
                return Err(Qcow2Error::OutOfFile {
                    what: "L2 table",
                    offset: p,
                    file_len: end,
                }
                .into());
            }
            for index in indices {
                self.read_l2(index, &c, p, &c)?;
            }
            used.push((p, end));
            self.sweep();
        }
        // What was waiting for this cluster.
        let here: Vec<((u64, u64), Need)> = self
            .needs
            .range((p, 0)..(end, 0))
            .map(|(k, v)| (*k, *v))
            .collect();
        for ((host, guest), need) in here {
            self.needs.remove(&(host, guest));
            let at = (host - p) as usize;
            match need {
                Need::Data => {
                    used.push((host, end));
                    self.data(guest, c.slice(at..))?;
                }
                Need::Compressed(len) => {
                    let stop = (host + len).min(end);
                    used.push((host, stop));
                    let bytes = &c[at..(stop - p) as usize];
                    if stop == host + len {
                        self.inflate(guest, host, bytes)?;
                    } else {
                        self.partials.push(Partial {
                            guest,
                            host,
                            len,
                            bytes: bytes.to_vec(),
                        });
                    }
                }
            }
        }
        if !self.mapped() && !self.used_up(&mut used, p, end) {
            if covers(&mut used, p, end) {
                // Kept only for the sector before the frontier, which a later table moves on.
                self.touched.insert(p);
            }
            self.held_bytes += c.len() as u64;
            self.held.insert(p, Held { data: c, used });
        }
        self.check_memory()
    }

    /// The L1 table is whole (it ended in the cluster at `p`, `c`): its L2 tables are read now
    /// when they were held, or awaited.
    fn read_l1(&mut self, p: u64, c: &Bytes) -> Result<(), ImportError> {
        let l1 = std::mem::take(&mut self.l1);
        for (index, entry) in qcow2::entries(&l1).enumerate() {
            let index = index as u64;
            match qcow2::l1_entry(&self.header, entry, OPEN_END)? {
                None => {
                    if self.zero_fill {
                        let base = index * self.header.l2_span();
                        let len = self.header.l2_span().min(self.header.virtual_size - base);
                        self.zeros(base, len)?;
                    }
                }
                Some(offset) if offset > p => {
                    self.tables.entry(offset).or_default().push(index);
                    self.table_refs += 1;
                }
                Some(offset) => {
                    // Left held: another L1 entry may name the same table.
                    let table = if offset == p {
                        c.clone()
                    } else {
                        match self.held.get(&offset) {
                            Some(h) => h.data.clone(),
                            None => return Err(passed("L2 table", offset)),
                        }
                    };
                    if (table.len() as u64) < self.cs {
                        return Err(passed("L2 table", offset));
                    }
                    self.read_l2(index, &table, p, c)?;
                }
            }
        }
        self.sweep();
        Ok(())
    }

    /// Decode the L2 table for L1 entry `index`, read while the stream is at the cluster at `p`
    /// (`c`): its zeros are written, the clusters already passed are taken from what is held,
    /// the rest are awaited.
    fn read_l2(&mut self, index: u64, table: &Bytes, p: u64, c: &Bytes) -> Result<(), ImportError> {
        let header = &self.header;
        let cs = self.cs;
        let base = index * header.l2_span();
        let entries = header
            .l2_entries()
            .min(header.virtual_size.saturating_sub(base).div_ceil(cs));
        let decoded: Vec<(u64, Cluster)> = (0..entries)
            .map(|e| {
                let at = e as usize * 8;
                let entry = u64::from_be_bytes(table[at..at + 8].try_into().expect("8 bytes"));
                Ok((base + e * cs, qcow2::l2_entry(header, entry, OPEN_END)?))
            })
            .collect::<Result<_, Qcow2Error>>()?;
        let now = p + c.len() as u64;
        for (guest, cluster) in decoded {
            let (host, need) = match cluster {
                Cluster::Zero | Cluster::Unallocated => {
                    if self.zero_fill {
                        let len = cs.min(self.header.virtual_size - guest);
                        self.zeros(guest, len)?;
                    }
                    continue;
                }
                Cluster::Data { host } => (host, Need::Data),
                Cluster::Compressed { host, len } => {
                    self.frontier = self.frontier.max(host + len);
                    (host, Need::Compressed(len))
                }
            };
            if host >= now {
                self.needs.insert((host, guest), need);
                continue;
            }
            // Passed already: only what is held (or the cluster at hand) has it.
            let len = match need {
                Need::Data => cs,
                Need::Compressed(len) => len,
            };
            let stop = (host + len).min(now);
            let bytes = self.past(host, stop, p, c)?;
            match need {
                Need::Data => self.data(guest, bytes)?,
                Need::Compressed(len) if stop == host + len => self.inflate(guest, host, &bytes)?,
                Need::Compressed(len) => self.partials.push(Partial {
                    guest,
                    host,
                    len,
                    bytes: bytes.to_vec(),
                }),
            }
        }
        // Per table: one L1 table may name the same table many times.
        self.check_memory()
    }

    /// The bytes `[from, to)` of the stream, all before the end of the cluster at `p` (`c`):
    /// from the held clusters and `c`. Used parts of held clusters are marked (see
    /// [`Streamer::sweep`]).
    fn past(&mut self, from: u64, to: u64, p: u64, c: &Bytes) -> Result<Bytes, ImportError> {
        let cs = self.cs;
        let first = from - from % cs;
        let mut out: Vec<Bytes> = Vec::new();
        let mut cluster = first;
        while cluster < to {
            let lo = from.max(cluster);
            let hi = to.min(cluster + cs);
            let piece = if cluster == p {
                c.slice((lo - p) as usize..((hi - p) as usize).min(c.len()))
            } else {
                let held = self
                    .held
                    .get_mut(&cluster)
                    .ok_or_else(|| passed("data", from))?;
                let piece = held
                    .data
                    .slice((lo - cluster) as usize..((hi - cluster) as usize).min(held.data.len()));
                held.used.push((lo, hi));
                if held.used.len() > 64 {
                    // Merged, they stay few: packed clusters touch one another.
                    covers(&mut held.used, cluster, cluster + held.data.len() as u64);
                }
                self.touched.insert(cluster);
                piece
            };
            out.push(piece);
            cluster += cs;
        }
        Ok(match out.len() {
            1 => out.pop().expect("one piece"),
            _ => Bytes::from(out.concat()),
        })
    }

    /// Whether the cluster `[from, to)`, of which `used` is placed, can go: all of it is placed
    /// and none of it is the sector a compressed cluster still to be placed may start in. A
    /// cluster let go that a table still to come needs after all makes the image not
    /// streamable, never a wrong image.
    fn used_up(&self, used: &mut Vec<(u64, u64)>, from: u64, to: u64) -> bool {
        let open = self.frontier.saturating_sub(512)..self.frontier;
        covers(used, from, to) && (open.is_empty() || open.end <= from || open.start >= to)
    }

    /// Let go of the held clusters that are used up (of those that may be: see `touched`); of
    /// all of them once every table is read.
    fn sweep(&mut self) {
        if self.mapped() {
            self.held.clear();
            self.held_bytes = 0;
            self.touched.clear();
            return;
        }
        for at in std::mem::take(&mut self.touched) {
            let Some(mut h) = self.held.remove(&at) else {
                continue;
            };
            let end = at + h.data.len() as u64;
            if self.used_up(&mut h.used, at, end) {
                self.held_bytes -= h.data.len() as u64;
                continue;
            }
            if covers(&mut h.used, at, end) {
                self.touched.insert(at);
            }
            self.held.insert(at, h);
        }
    }

    /// Let go of the held clusters the refcount table names, once it is read.
    fn drop_refblocks(&mut self) {
        let found: Vec<u64> = self
            .refblocks
            .iter()
            .filter(|b| self.held.contains_key(b))
            .copied()
            .collect();
        for at in found {
            if let Some(h) = self.held.remove(&at) {
                self.held_bytes -= h.data.len() as u64;
            }
        }
    }

    /// A data cluster at `guest`: `bytes` from its start (fewer at the end of the image: the
    /// rest reads as zeros).
    fn data(&mut self, guest: u64, bytes: Bytes) -> Result<(), ImportError> {
        let n = self.cs.min(self.header.virtual_size - guest) as usize;
        let data = if bytes.len() >= n {
            bytes.slice(..n)
        } else {
            let mut padded = bytes.to_vec();
            padded.resize(n, 0);
            Bytes::from(padded)
        };
        self.write(guest, data)
    }

    /// Gather a write; what is gathered is sent once it is large (one table can place the
    /// same bytes at every one of its entries).
    fn write(&mut self, offset: u64, data: Bytes) -> Result<(), ImportError> {
        self.ops_bytes += data.len() as u64;
        self.ops.push(Op::Data { offset, data });
        if self.ops_bytes >= OPS_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// A compressed cluster at `guest`, stored at `host` as `input`.
    fn inflate(&mut self, guest: u64, host: u64, input: &[u8]) -> Result<(), ImportError> {
        let n = self.cs.min(self.header.virtual_size - guest) as usize;
        let mut out = vec![0u8; n];
        let inflater = match &mut self.inflater {
            Some(i) => i,
            None => self
                .inflater
                .insert(Inflater::new(self.header.compression).map_err(ImportError::Damaged)?),
        };
        inflater.inflate(input, &mut out).map_err(|e| {
            ImportError::Damaged(format!(
                "compressed cluster at guest offset {guest} (host {host}): {e}"
            ))
        })?;
        self.write(guest, Bytes::from(out))
    }

    /// Zeros for a block target, joined into runs.
    fn zeros(&mut self, offset: u64, len: u64) -> Result<(), ImportError> {
        self.zero_run = match self.zero_run {
            Some((start, l)) if start + l == offset => Some((start, l + len)),
            Some((start, l)) => {
                self.ops.push(Op::Zero {
                    offset: start,
                    len: l,
                });
                Some((offset, len))
            }
            None => Some((offset, len)),
        };
        // A petabyte of unallocated tables is one run, not a million writes held here.
        if self.ops.len() >= 4096 {
            self.flush()?;
        }
        Ok(())
    }

    /// Send the gathered writes.
    fn flush(&mut self) -> Result<(), ImportError> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut self.ops);
        self.ops_bytes = 0;
        self.tx.blocking_send(Op::Many(ops)).map_err(|_| stopped())
    }

    /// Held clusters, partial ones and what is awaited stay within the budget.
    fn check_memory(&self) -> Result<(), ImportError> {
        let partial: u64 = self.partials.iter().map(|p| p.bytes.len() as u64).sum();
        let entries = self.needs.len() as u64 + self.table_refs + self.refblocks.len() as u64;
        let used = self.held_bytes
            + partial
            + entries * ENTRY_COST
            + self.l1.len() as u64
            + self.refcount_bytes.len() as u64;
        if used > self.hold_limit {
            return Err(ImportError::NotStreamable(format!(
                "more than {} of it would have to be held before the tables that place it arrive",
                amount(self.hold_limit)
            )));
        }
        Ok(())
    }

    /// The stream ended after `len` bytes: what was still awaited lies outside the image.
    fn finish(&mut self, len: u64) -> Result<(), ImportError> {
        for partial in std::mem::take(&mut self.partials) {
            // The last sector may run past the end of the file; qemu reads what is there.
            self.inflate(partial.guest, partial.host, &partial.bytes)?;
        }
        let l1_bytes = self.header.l1_size as u64 * 8;
        let out_of_file = |what, offset| Qcow2Error::OutOfFile {
            what,
            offset,
            file_len: len,
        };
        if self.header.l1_size > 0 && self.header.l1_table_offset + l1_bytes > len {
            return Err(out_of_file("L1 table", self.header.l1_table_offset).into());
        }
        if let Some(offset) = self.tables.keys().next() {
            return Err(out_of_file("L2 table", *offset).into());
        }
        if let Some(((host, _), need)) = self.needs.iter().next() {
            let what = match need {
                Need::Data => "data cluster",
                Need::Compressed(_) => "compressed cluster",
            };
            return Err(out_of_file(what, *host).into());
        }
        if let Some((offset, len)) = self.zero_run.take() {
            self.ops.push(Op::Zero { offset, len });
        }
        self.flush()
    }
}

/// The image places a table or data on bytes the stream has passed without keeping them.
fn passed(what: &str, offset: u64) -> ImportError {
    ImportError::NotStreamable(format!(
        "its {what} at offset {offset} comes before the table that places it, further back than the stream is kept"
    ))
}

fn amount(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// Whether the ranges in `used` cover `[from, to)`; they are merged in place.
fn covers(used: &mut Vec<(u64, u64)>, from: u64, to: u64) -> bool {
    used.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(used.len());
    for &(a, b) in used.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    *used = merged;
    used.iter().any(|&(a, b)| a <= from && b >= to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stream `image` through the converter as for a block device, onto a disk of garbage.
    fn onto_garbage(image: &[u8], hold: u64) -> Result<Vec<u8>, ImportError> {
        let (tx, mut rx) = mpsc::channel(1 << 16);
        let header = qcow2::parse_header(image, image.len() as u64)?;
        let mut disk = vec![0xeeu8; header.virtual_size as usize];
        let first = Bytes::copy_from_slice(
            &image[..image.len().min(block_len(header.cluster_size()) as usize)],
        );
        let rest = Box::new(std::io::Cursor::new(image[first.len()..].to_vec()));
        let mut s = Streamer::new(header, tx, true, hold);
        s.refcount_table(&first);
        let done = s.run(rest, first, u64::MAX, "the test");
        drop(s);
        fn apply(disk: &mut [u8], op: Op) {
            match op {
                Op::Data { offset, data } => {
                    disk[offset as usize..offset as usize + data.len()].copy_from_slice(&data)
                }
                Op::Zero { offset, len } => disk[offset as usize..(offset + len) as usize].fill(0),
                Op::Many(ops) => ops.into_iter().for_each(|o| apply(disk, o)),
            }
        }
        while let Ok(op) = rx.try_recv() {
            apply(&mut disk, op);
        }
        done.map(|()| disk)
    }

    /// Checked against qemu-img and qemu-io: the quick tier (`scripts/test --quick`) skips
    /// modules named `with_qemu`, the full suite runs them.
    mod with_qemu {
        use super::*;

        #[test]
        fn a_block_device_gets_every_byte_written() {
            use cdi_testkit::images::{assert_same, oracle, pattern, qemu_img};
            let dir = tempfile::tempdir().unwrap();
            let raw = dir.path().join("src.raw");
            std::fs::write(&raw, pattern(5 << 20)).unwrap();
            for (name, opts) in [
                ("plain", &[][..]),
                ("c4k-zlib", &["-c", "-o", "cluster_size=4096"][..]),
            ] {
                let image = dir.path().join(name);
                let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
                args.extend_from_slice(opts);
                args.extend([raw.to_str().unwrap(), image.to_str().unwrap()]);
                qemu_img(&args);
                // Zero clusters, a discarded range and a grown tail with no L2 table at all.
                let out = std::process::Command::new("qemu-io")
                    .args([
                        "-f",
                        "qcow2",
                        "-c",
                        "write -z 1M 1M",
                        "-c",
                        "discard 3M 64k",
                    ])
                    .arg(&image)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                qemu_img(&["resize", image.to_str().unwrap(), "12M"]);
                let disk = onto_garbage(&std::fs::read(&image).unwrap(), 64 << 20).unwrap();
                assert_same(&disk, &oracle(&image, "qcow2"), name);
            }
        }
    }

    #[test]
    fn coverage_merges_overlapping_and_touching_ranges() {
        let mut used = vec![(10, 20), (0, 5), (5, 9), (18, 30)];
        assert!(!covers(&mut used, 0, 30), "9..10 is a gap");
        assert_eq!(used, vec![(0, 9), (10, 30)]);
        used.push((8, 11));
        assert!(covers(&mut used, 0, 30));
        assert!(covers(&mut vec![(0, 64)], 0, 64));
        assert!(!covers(&mut Vec::new(), 0, 1));
    }
}
