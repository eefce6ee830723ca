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

// A password that comes with its at-rest form (acl.Command.PasswordHash, computed by the
// sender) is not hashed again: the store keeps that form, exports it, and a store that loads
// it (a restarted broker) accepts the password and nothing else. A form weaker than the
// store's own (fewer iterations) is ignored and the store hashes the password itself.
func TestGivenPasswordHashIsKept(t *testing.T) {
	ctx := context.Background()
	s, err := NewStore(StoreConfig{KeepHashes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	given, err := HashPassword("pw-given")
	if err != nil {
		t.Fatal(err)
	}
	weak := &acl.PasswordHash{Salt: given.Salt, Iterations: 1, Hash: make([]byte, 64)}
	if err := s.Execute(ctx, []acl.Command{
		{Op: acl.OpCreateClient, Username: "a2a:given", Password: "pw-given", PasswordHash: given},
		{Op: acl.OpCreateClient, Username: "a2a:weak", Password: "pw-weak", PasswordHash: weak},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := s.hashes.Load(); got != 1 {
		t.Fatalf("two passwords, one with its form: %d hashed by the store, want 1", got)
	}
	table, err := s.ExportTable(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := table.Credentials["a2a:given"]; c == nil || string(c.Hash) != string(given.Hash) || string(c.Salt) != string(given.Salt) {
		t.Fatalf("exported %+v, want the given form", c)
	}
	if c := table.Credentials["a2a:weak"]; c == nil || c.Iterations != DefaultIterations || string(c.Hash) == string(weak.Hash) {
		t.Fatalf("a weak form was kept: %+v", c)
	}
	if !s.Authenticate("a2a:given", "pw-given", "") || s.Authenticate("a2a:given", "pw-weak", "") {
		t.Fatal("the given password is not the one accepted")
	}
	restarted, err := NewStore(StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.ImportTable(table); err != nil {
		t.Fatal(err)
	}
	for user, pw := range map[string]string{"a2a:given": "pw-given", "a2a:weak": "pw-weak"} {
		if !restarted.Authenticate(user, pw, "") || restarted.Authenticate(user, pw+"x", "") {
			t.Errorf("%s after a reload from its exported form: the password is not (only) the one accepted", user)
		}
	}
}
