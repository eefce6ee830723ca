package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// snapshot is the JSON file format.
type snapshot struct {
	Version     int                    `json:"version"`
	State       acl.State              `json:"state"`
	Credentials map[string]*credential `json:"credentials"`
}

// loadSnapshot reads the file (nil when it does not exist).
func loadSnapshot(path string) (*snapshot, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("embedded: read snapshot: %w", err)
	}
	var snap snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("embedded: decode snapshot %s: %w", path, err)
	}
	if snap.Version != 1 {
		return nil, fmt.Errorf("embedded: snapshot %s has unknown version %d", path, snap.Version)
	}
	return &snap, nil
}

// snapshotWriter keeps the snapshot file current without making a command
// wait for it: Execute marks the store changed and returns; one background
// goroutine hashes new passwords (PBKDF2) and rewrites the file, as often as
// it can but at most once per round of changes (group commit without a
// timer: every change made while a write runs goes into the next one). A
// crash can lose the changes of the last round; the operator's resync (and
// its broker state-loss check) re-applies them.
type snapshotWriter struct {
	s       *Store
	wake    chan struct{} // capacity 1: a pending round
	flushes chan chan error
	stop    chan struct{}
	stopped chan struct{}

	mu      sync.Mutex
	lastErr error // of the last write, reported by the next Execute
	closed  bool
}

func startSnapshotWriter(s *Store) *snapshotWriter {
	w := &snapshotWriter{s: s, wake: make(chan struct{}, 1), flushes: make(chan chan error), stop: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// changed schedules a write and returns the error of the previous one, so a
// broken disk shows up in the operator's reconciles.
func (w *snapshotWriter) changed() error {
	select {
	case w.wake <- struct{}{}:
	default: // a round is already pending and will include this change
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

func (w *snapshotWriter) flush() error {
	reply := make(chan error, 1)
	select {
	case w.flushes <- reply:
		return <-reply
	case <-w.stopped:
		return errors.New("embedded: snapshot writer stopped")
	}
}

func (w *snapshotWriter) close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.stopped
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

func (w *snapshotWriter) run() {
	defer close(w.stopped)
	for {
		select {
		case <-w.wake:
			w.write()
		case reply := <-w.flushes:
			select {
			case <-w.wake:
			default:
			}
			reply <- w.write()
		case <-w.stop:
			w.write()
			return
		}
	}
}

// write hashes pending passwords and rewrites the file atomically.
func (w *snapshotWriter) write() error {
	err := w.s.hashPending()
	if err == nil && w.s.cfg.SnapshotPath != "" {
		err = w.s.save()
	}
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
	return err
}

// unhashedCredential is a credential installed for username whose PBKDF2 form is still to
// compute.
type unhashedCredential struct {
	username string
	cred     *credential
}

// hashPending computes the PBKDF2 form of every credential that has none yet
// (slow: done without holding the store's lock). It looks only at the credentials installed
// since its last round (Store.unhashed), not at every client's, and one round runs at a time.
func (s *Store) hashPending() error {
	s.hashing.Lock()
	defer s.hashing.Unlock()
	type job struct {
		unhashedCredential
		password string
		salt     []byte
	}
	var jobs []job
	s.mu.Lock()
	for _, u := range s.unhashed {
		// A credential replaced or deleted since is not the client's any more: skip it.
		if u.cred.pending != "" && s.creds[u.username] == u.cred {
			jobs = append(jobs, job{u, u.cred.pending, u.cred.Salt})
		}
	}
	s.unhashed = nil
	s.mu.Unlock()
	for i, j := range jobs {
		h, err := hashed(j.password, j.salt, s.cfg.Iterations)
		s.mu.Lock()
		if err != nil {
			// The rest stay pending for the next round.
			for _, rest := range jobs[i:] {
				s.unhashed = append(s.unhashed, rest.unhashedCredential)
			}
			s.mu.Unlock()
			return fmt.Errorf("embedded: snapshot: %w", err)
		}
		j.cred.Hash, j.cred.Iterations, j.cred.pending = h, s.cfg.Iterations, ""
		s.mu.Unlock()
		s.hashes.Add(1)
	}
	return nil
}

// save writes the snapshot atomically (temp file + rename, mode 0600).
// Credentials still waiting for their hash are left out; the round that
// created them writes again.
func (s *Store) save() error {
	s.mu.RLock()
	creds := make(map[string]*credential, len(s.creds))
	for u, c := range s.creds {
		if c.pending == "" {
			creds[u] = c
		}
	}
	data, err := json.MarshalIndent(snapshot{Version: 1, State: s.state, Credentials: creds}, "", "  ")
	s.mu.RUnlock()
	if err != nil {
		return fmt.Errorf("embedded: encode snapshot: %w", err)
	}
	path := s.cfg.SnapshotPath
	tmp, err := os.CreateTemp(filepath.Dir(path), ".snapshot-*")
	if err != nil {
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("embedded: sync snapshot: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("embedded: write snapshot: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("embedded: replace snapshot: %w", err)
	}
	return nil
}
