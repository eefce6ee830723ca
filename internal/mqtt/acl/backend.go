package acl

import (
	"context"
	"errors"
	"fmt"
)

// Backend is a broker that stores State: Mosquitto's dynamic-security
// plugin (package dynsec) or the embedded mochi broker (package embedded).
// Everything else (Apply, SetPassword) is built on these methods, so both
// backends behave the same by construction. A broker whose authorization
// scales differently (docs/broker.md: EMQX's built-in database over REST,
// or HTTP authorization answered from a Policy) implements the same
// methods: Observe and Execute over its own API, Check with its decisions.
type Backend interface {
	// Prefix is the name prefix of the objects this backend manages; Apply
	// refuses to touch any other name.
	Prefix() string
	// Observe returns what the broker holds now, without side effects: only
	// objects whose names carry Prefix. With only == nil everything owned is
	// listed; otherwise just the named objects (absent ones are left out).
	// DefaultACL is always filled in.
	Observe(ctx context.Context, only *Names) (State, error)
	// Execute runs commands in order (batched where the backend can).
	// "Already exists" and "not found" replies are successes, so a retry
	// after a partial failure converges. Every failed command is reported as
	// a *CommandError, all joined.
	Execute(ctx context.Context, cmds []Command) error
	// Check decides whether username may perform access on topic with the
	// broker's current state (dynsec semantics, see Policy.Check). It works
	// for any username, not only prefixed ones.
	Check(ctx context.Context, username string, access Access, topic string) (Decision, error)
	// Stats counts what was sent to the broker since the backend started.
	Stats() Stats
}

// CachedObserver is a Backend that keeps its own copy of the broker's state, fed by the broker's
// answers (its own changes and, as they arrive, other writers'), and can observe from it without
// asking the broker. Its State is the broker's as of the last change the backend learnt of: it
// may lag another writer's change by the time that change's answer takes to reach it (and never
// by more than the backend's bound on an unconfirmed copy). That is the guarantee a reconcile has
// anyway between its Observe and its Execute; a change it misses is repaired by the next
// reconcile of the same object, as today. Observe stays the read of "now", for everything that
// must see a change the caller itself just learnt of (a test, a hand-made repair).
type CachedObserver interface {
	ObserveCached(ctx context.Context, only *Names) (State, error)
}

// ObserveCached observes from b's copy when b keeps one (CachedObserver), and asks the broker
// otherwise.
func ObserveCached(ctx context.Context, b Backend, only *Names) (State, error) {
	if c, ok := b.(CachedObserver); ok {
		return c.ObserveCached(ctx, only)
	}
	return b.Observe(ctx, only)
}

// Stats counts broker commands; "dynsec commands per agent" is
// Mutations divided by the number of agents applied.
type Stats struct {
	// Mutations is the number of state-changing commands executed.
	Mutations uint64
	// Reads is the number of list/get commands used by Observe and Check.
	Reads uint64
	// RoundTrips is the number of request/response exchanges (one MQTT
	// message each way for dynsec).
	RoundTrips uint64
	// Kicks is the number of executed commands that disconnected someone,
	// and KickedUsernames the sum of the usernames each of them named (see
	// Kick for what each backend can know).
	Kicks           uint64
	KickedUsernames uint64
}

// Verdict is a backend's judgement of one command, in the model's terms. Each backend maps its
// own replies to it (Mosquitto's dynsec texts in package dynsec, the embedded store's own
// checks), so that "already exists" and "not found" mean the same everywhere.
type Verdict int

const (
	// Applied: the command did what it says.
	Applied Verdict = iota
	// AlreadyDone: the command's goal was reached before it ran (the object, link or rule it
	// creates exists; the one it deletes is gone). A success: retries and races converge.
	AlreadyDone
	// LostContent: a create found its object already there while it carried content (a role
	// with rules): the broker kept the existing object as it is, so what the command meant to
	// write was not written. It happens when another writer created the object between the
	// caller's observation and its command; the caller observes again and modifies.
	LostContent
	// Refused: anything else the broker would not do.
	Refused
)

// Failed reports whether v is reported as an error (LostContent or Refused).
func (v Verdict) Failed() bool { return v == LostContent || v == Refused }

// CommandError is a command the broker refused, with its verdict and its own words.
type CommandError struct {
	Command Command
	Verdict Verdict
	// Message is the broker's error text, e.g. "Role not found".
	Message string
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s: broker refused: %s", e.Command, e.Message)
}

// OnlyLostContent reports whether err is made only of LostContent verdicts (however joined or
// wrapped): a race with another writer that the next observation resolves, not a failure.
func OnlyLostContent(err error) bool {
	if err == nil {
		return false
	}
	switch e := err.(type) {
	case *CommandError:
		return e.Verdict == LostContent
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if !OnlyLostContent(inner) {
				return false
			}
		}
		return len(e.Unwrap()) > 0
	case interface{ Unwrap() error }:
		return OnlyLostContent(e.Unwrap())
	default:
		return false
	}
}

// Result tells what an Apply did.
type Result struct {
	// Commands are the commands executed (empty when already in sync).
	Commands []Command
}

// Apply makes the broker match d: Observe (the whole prefix when pruning,
// otherwise just the names involved), Diff, Execute. Running it twice in a
// row executes nothing the second time; running it after someone changed or
// deleted managed objects by hand repairs them.
func Apply(ctx context.Context, b Backend, d Desired) (Result, error) {
	var only *Names
	if !d.Prune {
		n := involved(d)
		only = &n
	}
	observed, err := b.Observe(ctx, only)
	if err != nil {
		return Result{}, fmt.Errorf("apply: observe broker state: %w", err)
	}
	if err := d.Validate(b.Prefix(), observed); err != nil {
		return Result{}, fmt.Errorf("apply: invalid desired state: %w", err)
	}
	cmds := Diff(observed, d)
	if len(cmds) == 0 {
		return Result{}, nil
	}
	if err := b.Execute(ctx, cmds); err != nil {
		return Result{Commands: cmds}, fmt.Errorf("apply %d commands (%s): %w", len(cmds), Summary(cmds), err)
	}
	return Result{Commands: cmds}, nil
}

// involved lists every name d creates, changes, deletes or references, so a
// scoped Observe sees all of them.
func involved(d Desired) Names {
	var n Names
	seen := map[string]bool{}
	addRole := func(s string) {
		if !seen["r:"+s] {
			seen["r:"+s] = true
			n.Roles = append(n.Roles, s)
		}
	}
	addGroup := func(s string) {
		if !seen["g:"+s] {
			seen["g:"+s] = true
			n.Groups = append(n.Groups, s)
		}
	}
	addClient := func(s string) {
		if !seen["c:"+s] {
			seen["c:"+s] = true
			n.Clients = append(n.Clients, s)
		}
	}
	for _, k := range sortedKeys(d.Roles) {
		addRole(k)
	}
	for _, k := range sortedKeys(d.Groups) {
		addGroup(k)
		for _, r := range d.Groups[k].Roles {
			addRole(r.Name)
		}
	}
	for _, k := range sortedKeys(d.Clients) {
		addClient(k)
		for _, r := range d.Clients[k].Roles {
			addRole(r.Name)
		}
		for _, g := range d.Clients[k].Groups {
			addGroup(g)
		}
	}
	for _, s := range d.Delete.Roles {
		addRole(s)
	}
	for _, s := range d.CreateRoles {
		addRole(s)
	}
	for _, s := range d.Delete.Groups {
		addGroup(s)
	}
	for _, s := range d.Delete.Clients {
		addClient(s)
	}
	return n
}

// ErrNoPassword is returned by SetPassword for an empty password, which
// dynsec refuses.
var ErrNoPassword = errors.New("empty password")

// SetPassword replaces a client's password (one setClientPassword; the
// broker disconnects the client so the old password stops working for
// existing sessions too).
func SetPassword(ctx context.Context, b Backend, username, password string) error {
	if password == "" {
		return fmt.Errorf("set password of %q: %w", username, ErrNoPassword)
	}
	if err := ValidateName("user", username); err != nil {
		return fmt.Errorf("set password: %w", err)
	}
	if len(username) < len(b.Prefix()) || username[:len(b.Prefix())] != b.Prefix() {
		return fmt.Errorf("set password: client %q does not carry the managed prefix %q", username, b.Prefix())
	}
	if err := b.Execute(ctx, []Command{{Op: OpSetClientPassword, Username: username, Password: password}}); err != nil {
		return fmt.Errorf("set password of %q: %w", username, err)
	}
	return nil
}
