package convstore

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// changeLog is the bbolt journal's write-ahead log: each group commit is
// one record appended to a preallocated file and one fdatasync. bbolt's own
// commit costs two fdatasyncs (its pages, then its meta page) and a file
// that grows; measured on this machine, 180–250 µs per commit against
// 80–110 µs for a write and fdatasync in a preallocated file
// (docs/conversation-service.md, "The bbolt journal's log"). The records
// are applied to bbolt behind the log, in large transactions off every
// waited path; bbolt stores the sequence number of the last record it
// holds, so recovery replays only the records after it.
//
// Layout: records one after another from offset 0, each
//
//	length (4 bytes, of seq and payload) | crc32c (4, of seq and payload) | seq (8) | payload
//
// Sequence numbers increase by one. Once everything in the file is in
// bbolt, the log starts again at offset 0 (rewind): the stale records left
// behind the new tail carry smaller sequence numbers, so a scan stops at the
// first record that is torn (CRC), zero (never written) or out of sequence.
//
// Why not a library: etcd's storage/wal is the field's log for bbolt, but it
// is shaped for raft (HardState, entries, snapshots) and requiring
// go.etcd.io/etcd/server/v3 downgrades controller-runtime and the
// Kubernetes modules in this module graph; tidwall/wal has no checksum, so
// a torn tail after a power loss makes its Open fail, and it fsyncs a file
// that grows.
type changeLog struct {
	f      *os.File
	size   int64 // allocated bytes
	off    int64 // where the next record goes
	noSync bool
	buf    []byte
}

// logHeader is the length, crc and seq of a record.
const logHeader = 16

// logAllocate is the size the log file is preallocated to (and grown by).
const logAllocate = 64 << 20

// logRewindAt: past this offset the log rewinds as soon as bbolt holds
// every record in it.
const logRewindAt = 32 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openChangeLog opens (creating and preallocating) the log at path and
// calls replay for each valid record, in order.
func openChangeLog(path string, noSync bool, replay func(seq uint64, payload []byte) error) (*changeLog, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open change log: %w", err)
	}
	l := &changeLog{f: f, noSync: noSync}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat change log: %w", err)
	}
	l.size = st.Size()
	if err := l.scan(replay); err != nil {
		_ = f.Close()
		return nil, err
	}
	if l.size < logAllocate {
		if err := l.allocate(logAllocate); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return l, nil
}

// scan reads records from offset 0 until the first invalid one.
func (l *changeLog) scan(replay func(seq uint64, payload []byte) error) error {
	r := bufio.NewReaderSize(io.NewSectionReader(l.f, 0, l.size), 1<<20)
	var hdr [logHeader]byte
	var prev uint64
	var off int64
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			break
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:4]))
		sum := binary.LittleEndian.Uint32(hdr[4:8])
		seq := binary.LittleEndian.Uint64(hdr[8:16])
		if n < 8 || off+8+n > l.size || (prev != 0 && seq != prev+1) {
			break
		}
		payload := make([]byte, n-8)
		if _, err := io.ReadFull(r, payload); err != nil {
			break
		}
		c := crc32.Update(crc32.Checksum(hdr[8:16], castagnoli), castagnoli, payload)
		if c != sum {
			break
		}
		if err := replay(seq, payload); err != nil {
			return err
		}
		prev, off = seq, off+8+n
	}
	l.off = off
	return nil
}

func (l *changeLog) allocate(size int64) error {
	if err := unix.Fallocate(int(l.f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("preallocate change log: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync change log: %w", err)
	}
	l.size = size
	return nil
}

// append writes one record and makes it durable.
func (l *changeLog) append(seq uint64, payload []byte) error {
	rec := l.buf[:0]
	rec = binary.LittleEndian.AppendUint32(rec, uint32(8+len(payload)))
	rec = binary.LittleEndian.AppendUint32(rec, 0)
	rec = binary.LittleEndian.AppendUint64(rec, seq)
	rec = append(rec, payload...)
	binary.LittleEndian.PutUint32(rec[4:8], crc32.Checksum(rec[8:], castagnoli))
	l.buf = rec
	if end := l.off + int64(len(rec)); end > l.size {
		// A group larger than what is left: grow (the file keeps its
		// allocation past a rewind).
		if err := l.allocate(end + logAllocate); err != nil {
			return err
		}
	}
	if _, err := l.f.WriteAt(rec, l.off); err != nil {
		return fmt.Errorf("write change log: %w", err)
	}
	if !l.noSync {
		if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
			return fmt.Errorf("sync change log: %w", err)
		}
	}
	l.off += int64(len(rec))
	if cap(l.buf) > 1<<20 {
		l.buf = nil // one large group keeps no megabytes around
	}
	return nil
}

// rewind starts the log again at offset 0; only once bbolt holds every
// record in it.
func (l *changeLog) rewind() { l.off = 0 }

func (l *changeLog) close() error { return l.f.Close() }

// encodeChanges is a group of changes as one log record's payload. Fence is
// not kept (bbolt has one writer).
func encodeChanges(dst []byte, changes []Change) []byte {
	e := enc{b: dst}
	e.u(uint64(len(changes)))
	for i := range changes {
		ch := &changes[i]
		e.s(ch.Agent)
		e.s(ch.ContextID)
		var flags byte
		if ch.Delete {
			flags |= 1
		}
		if ch.Header != nil {
			flags |= 2
		}
		e.byte(flags)
		if ch.Header != nil {
			e.bytes(ch.Header)
		}
		e.u(uint64(len(ch.Put)))
		for _, t := range ch.Put {
			e.s(t.ID)
			e.bytes(t.Data)
		}
		e.u(uint64(len(ch.Del)))
		for _, id := range ch.Del {
			e.s(id)
		}
		e.u(uint64(len(ch.PutContent)))
		for _, it := range ch.PutContent {
			e.u(it.Seq)
			e.bytes(it.Data)
		}
		e.u(uint64(len(ch.DelContent)))
		for _, seq := range ch.DelContent {
			e.u(seq)
		}
	}
	return e.b
}

// decodeChanges reverses encodeChanges. The byte slices it returns alias b.
func decodeChanges(b []byte) ([]Change, error) {
	r := dec{b: b}
	n := r.count()
	changes := make([]Change, 0, n)
	for range n {
		ch := Change{Agent: r.s(), ContextID: r.s()}
		flags := r.byte()
		ch.Delete = flags&1 != 0
		if flags&2 != 0 {
			ch.Header = r.raw()
		}
		for range r.count() {
			ch.Put = append(ch.Put, TaskRecord{ID: r.s(), Data: r.raw()})
		}
		for range r.count() {
			ch.Del = append(ch.Del, r.s())
		}
		for range r.count() {
			ch.PutContent = append(ch.PutContent, ContentRecord{Seq: r.u(), Data: r.raw()})
		}
		for range r.count() {
			ch.DelContent = append(ch.DelContent, r.u())
		}
		if r.err != nil {
			return nil, errRecord
		}
		changes = append(changes, ch)
	}
	if r.err != nil || len(r.b) != 0 {
		return nil, errRecord
	}
	return changes, nil
}

// count is a list length, bounded by what is left (each element takes at
// least one byte), so a corrupt length cannot allocate without bound.
func (d *dec) count() int {
	v := d.u()
	if v > uint64(len(d.b)) {
		d.err = errRecord
		return 0
	}
	return int(v)
}
