package embedded

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Each password set is hashed (PBKDF2) once, however many rounds ask for the hashes at once
// (the background hasher and an export run together after every change in the Mosquitto
// plugin), and a password replaced before its round is not hashed at all: the hashing is the
// largest part of what a change costs the broker.
func TestEachPasswordIsHashedOnce(t *testing.T) {
	s, err := NewStore(StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const clients, rotations = 50, 20
	for i := range clients {
		if err := s.Execute(ctx, []acl.Command{{Op: acl.OpCreateClient, Username: fmt.Sprintf("a2a:u%d", i), Password: fmt.Sprintf("pw-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := s.hashes.Load(); got != clients {
		t.Fatalf("%d clients created: %d hashes, want %d", clients, got, clients)
	}
	for i := range rotations {
		if err := acl.SetPassword(ctx, s, "a2a:u1", fmt.Sprintf("rotated-%d", i)); err != nil {
			t.Fatal(err)
		}
		// Two rounds at once, as the hasher and the plugin's disk writer run.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := s.ExportTable(&acl.Names{Clients: []string{"a2a:u1"}}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := s.hashes.Load(); got != clients+rotations {
		t.Errorf("after %d rotations: %d hashes, want %d (one per password)", rotations, got, clients+rotations)
	}

	// Replaced twice, then deleted another: only the last password of a2a:u2 is hashed.
	before := s.hashes.Load()
	s.hashing.Lock() // no round runs until all four are made
	for _, pw := range []string{"a", "b", "c"} {
		if err := acl.SetPassword(ctx, s, "a2a:u2", pw); err != nil {
			t.Fatal(err)
		}
	}
	if err := acl.SetPassword(ctx, s, "a2a:u3", "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Execute(ctx, []acl.Command{{Op: acl.OpDeleteClient, Username: "a2a:u3"}}); err != nil {
		t.Fatal(err)
	}
	s.hashing.Unlock()
	tab, err := s.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.hashes.Load() - before; got != 1 {
		t.Errorf("three passwords of one client and one of a deleted client: %d hashes, want 1", got)
	}
	if len(tab.Unhashed) != 0 {
		t.Errorf("exported with unhashed passwords: %v", tab.Unhashed)
	}
	c := tab.Credentials["a2a:u2"]
	if c == nil || !(&credential{Salt: c.Salt, Iterations: c.Iterations, Hash: c.Hash}).slowMatch("c") {
		t.Error("the exported hash of a2a:u2 is not its last password's")
	}
}
