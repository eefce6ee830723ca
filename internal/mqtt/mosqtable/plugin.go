package mosqtable

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// PluginConfig configures the broker's side (the plugin's options in mosquitto.conf).
type PluginConfig struct {
	// StateDir holds the table (bbolt, table.db). Empty: memory only (a restart forgets it).
	StateDir string
	// AdminUsername and AdminPassword are the bootstrap admin: the one user that may connect
	// before the plugin has a table, may send on ControlTopic and read ResponseTopic, and may
	// do anything else (a superuser, as dynsec's admin role grants).
	AdminUsername, AdminPassword string
	// Kick ends every connection of a username without its Will (the host's
	// mosquitto_kick_client_by_username). It runs on the broker's thread, inside a control
	// request, and may call Disconnected back.
	Kick func(username string)
	// Publish sends a message from the broker itself (the host's mosquitto_broker_publish_copy,
	// QoS 1, not retained): the connection events on PresenceTopic. It runs on the broker's
	// thread. Nil: no events (the live set is still answered by OpPresence).
	Publish func(topic string, payload []byte)
	// Logf writes to the broker's log. It runs on the broker's thread only: Mosquitto's logging
	// also publishes the line on $SYS/broker/log (log_dest topic), into its message store, which
	// is not for other threads.
	Logf func(format string, args ...any)
	// BackgroundLogf writes what the plugin's own goroutines report (the disk writer's errors)
	// where another thread may write (the plugin's stderr, the pod's log). Nil: dropped (the
	// plugin's close still returns the disk's last error).
	BackgroundLogf func(format string, args ...any)
	// Trace, when set, gets one line per control message (its sender, op, commands, sizes and
	// time, and the CONNECT and ACL checks since the previous one) and one per disk round: what
	// a change brings to the broker, counted. Nil by default (the plugin's
	// A2A_FLEET_TABLE_TRACE sets its stderr). Not the broker's log: the disk rounds run off the
	// broker's thread, and Mosquitto's logging is not for other threads.
	Trace io.Writer
}

// Plugin is the decision table inside the broker. Every method runs on Mosquitto's single
// thread except the background writer; each answer costs hash lookups (the store's policy),
// never a walk over the fleet.
type Plugin struct {
	cfg    PluginConfig
	store  *embedded.Store
	conns  *liveConns
	disk   *journal // nil without StateDir
	boot   string
	loaded atomic.Bool
	gen    atomic.Uint64

	mu    sync.Mutex // guards epoch
	epoch string

	// traced counts, for Trace, what the broker asked since the last control message (broker
	// thread only).
	traced traceCounts

	// staged is an import in parts, until its last (broker thread only).
	staged       *embedded.Table
	stagedImport string
	stagedParts  int
}

// StartPlugin opens the table on disk (when configured). A disk without a table leaves the
// plugin unloaded: it fails closed until the operator imports one.
func StartPlugin(cfg PluginConfig) (*Plugin, error) {
	if cfg.AdminUsername == "" || cfg.AdminPassword == "" {
		return nil, errors.New("mosqtable: the plugin needs admin_username and admin_password")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.BackgroundLogf == nil {
		cfg.BackgroundLogf = func(string, ...any) {}
	}
	if cfg.Kick == nil {
		cfg.Kick = func(string) {}
	}
	p := &Plugin{cfg: cfg, boot: randomID()}
	p.conns = newLiveConns(cfg.Kick, p.publishPresence)
	store, err := embedded.NewStore(embedded.StoreConfig{
		Prefix: acl.DefaultPrefix, AdminUsername: cfg.AdminUsername, AdminPassword: cfg.AdminPassword,
		KeepHashes: cfg.StateDir != "",
		OnChange: func(n acl.Names) {
			if p.disk != nil {
				p.disk.changed(n)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mosqtable: %w", err)
	}
	p.store = store
	store.AttachConnections(p.conns)
	if cfg.StateDir != "" {
		j, st, err := openJournal(cfg.StateDir, store, p.gen.Load, cfg.BackgroundLogf, cfg.Trace)
		if err != nil {
			_ = store.Close()
			return nil, err
		}
		p.disk = j
		if st.table != nil {
			if err := store.ImportTable(*st.table); err != nil {
				_ = j.close()
				_ = store.Close()
				return nil, fmt.Errorf("mosqtable: load %s: %w", cfg.StateDir, err)
			}
			p.epoch = st.epoch
			p.gen.Store(st.generation)
			p.loaded.Store(true)
			c, r, g := store.Size()
			cfg.Logf("a2a-fleet table: loaded from %s (epoch %s, generation %d): %d clients, %d roles, %d groups", cfg.StateDir, st.epoch, st.generation, c, r, g)
		} else {
			cfg.Logf("a2a-fleet table: no table in %s: only the admin may connect until the operator imports one", cfg.StateDir)
		}
	}
	return p, nil
}

// Close writes what is pending and releases the disk.
func (p *Plugin) Close() error {
	var errs []error
	if p.disk != nil {
		errs = append(errs, p.disk.close())
	}
	errs = append(errs, p.store.Close())
	return errors.Join(errs...)
}

// Flush waits until the disk holds every change made so far (no-op without StateDir).
func (p *Plugin) Flush() error {
	if p.disk == nil {
		return nil
	}
	return p.disk.flush()
}

// Authenticate decides the CONNECT of connection conn. Before a table is loaded only the admin
// passes. A successful CONNECT is counted as live until Disconnected(conn) (for kicks and
// presence). The strings may be views of the host's memory: nothing keeps them beyond the call.
func (p *Plugin) Authenticate(conn ConnID, username, password, clientID string) bool {
	switch {
	case username == "":
		p.refused(clientID, "CONNECT without a username")
		return false
	case !p.loaded.Load() && !p.store.IsAdmin(username):
		p.refused(clientID, "the broker has no decision table yet (only its admin may connect)")
		return false
	case p.countAuth() && !p.store.Authenticate(username, password, clientID):
		p.refused(clientID, "bad username or password, or a client ID the username may not use")
		return false
	}
	p.conns.connected(conn, username, clientID)
	return true
}

// Allows decides a PUBLISH (Publish), a delivery (Receive), a SUBSCRIBE or an UNSUBSCRIBE
// check. The control topics are the admin's only.
func (p *Plugin) Allows(username string, access acl.Access, topic string) bool {
	if username == "" {
		return false
	}
	if p.cfg.Trace != nil {
		p.traced.check(access)
	}
	return p.store.Allows(username, access, topic)
}

// Disconnected forgets connection conn; reason is the broker's, in words. A connection it never
// let in (a refused CONNECT) or already forgot (Mosquitto reports a taken-over session's old
// connection a second time) changes nothing.
func (p *Plugin) Disconnected(conn ConnID, reason string) {
	p.conns.disconnected(conn, reason)
}

// Status is the plugin's current state.
func (p *Plugin) Status() Status {
	c, r, g := p.store.Size()
	p.mu.Lock()
	epoch := p.epoch
	p.mu.Unlock()
	return Status{Loaded: p.loaded.Load(), Epoch: epoch, Boot: p.boot, Generation: p.gen.Load(), RoleEdits: true, Clients: c, Roles: r, Groups: g}
}

// Control answers one message on ControlTopic from sender (the publisher's username); the
// result is published on ResponseTopic. Only the admin is answered at all.
func (p *Plugin) Control(sender string, payload []byte) []byte {
	var req Request
	if p.cfg.Trace == nil {
		return p.control(sender, payload, &req)
	}
	start := time.Now()
	out := p.control(sender, payload, &req)
	p.trace(sender, payload, req, out, time.Since(start))
	return out
}

// control decodes payload into req and answers it.
func (p *Plugin) control(sender string, payload []byte, req *Request) []byte {
	resp := Response{}
	switch err := json.Unmarshal(payload, req); {
	case err != nil:
		resp.Error = "invalid request: " + err.Error()
	case !p.store.IsAdmin(sender):
		resp.Error = "not authorised"
	default:
		resp = p.handle(*req)
	}
	resp.ID = req.ID
	resp.Status = p.Status()
	out, err := json.Marshal(resp)
	if err != nil {
		out, _ = json.Marshal(Response{ID: req.ID, Error: "encode response: " + err.Error(), Status: p.Status()})
	}
	return out
}

func (p *Plugin) handle(req Request) Response {
	var resp Response
	switch req.Op {
	case OpStatus:
	case OpPresence:
		live := p.Presence()
		resp.Presence = &live
	case OpExecute:
		if !p.loaded.Load() {
			resp.Error = ErrTableNotLoaded
			return resp
		}
		if err := applyEdits(p.store, &req, p.gen.Load()); err != nil {
			p.cfg.Logf("a2a-fleet table: %s: %v", ErrStaleEdit, err)
			resp.Error = ErrStaleEdit
			return resp
		}
		outs, err := p.store.ExecuteEach(context.Background(), req.Commands)
		if err != nil {
			// The commands ran; the error is the disk's (reported, the table is in memory).
			p.cfg.Logf("a2a-fleet table: %v", err)
		}
		p.persistPasswords(req.Commands, outs)
		p.gen.Add(1)
		p.genChanged()
		resp.Outcomes = outs
	case OpExport:
		if !p.loaded.Load() {
			resp.Error = ErrTableNotLoaded
			return resp
		}
		t, err := p.store.ExportTable(nil)
		if err != nil {
			resp.Error = err.Error()
			return resp
		}
		resp.Table = &t
	case OpImport:
		if req.Table == nil {
			resp.Error = "import without a table"
			return resp
		}
		t, err := p.stage(req)
		if err == nil && t != nil {
			err = p.importTable(*t)
		}
		if err != nil {
			resp.Error = err.Error()
		}
	default:
		resp.Error = fmt.Sprintf("unknown op %q", req.Op)
	}
	return resp
}

// persistPasswords queues for the disk the clients whose password an applied command set: a
// password change alone changes no role, group or client entry, so the store's change report
// (which drives the policy) does not name them, and without this the disk would keep the old
// password, which a restarted broker would accept again.
func (p *Plugin) persistPasswords(cmds []acl.Command, outs []embedded.Outcome) {
	if p.disk == nil {
		return
	}
	var users []string
	for i, c := range cmds {
		if i < len(outs) && outs[i].Verdict == acl.Applied && c.Password != "" &&
			(c.Op == acl.OpSetClientPassword || c.Op == acl.OpModifyClient || c.Op == acl.OpCreateClient) {
			users = append(users, c.Username)
		}
	}
	if len(users) > 0 {
		p.disk.changed(acl.Names{Clients: users})
	}
}

// genChanged has the disk record the new generation (a round of its own when the change's
// objects were written before the count moved).
func (p *Plugin) genChanged() {
	if p.disk != nil {
		p.disk.poke()
	}
}

// stage collects the parts of one import and returns the whole table with its last part (nil
// before).
func (p *Plugin) stage(req Request) (*embedded.Table, error) {
	if req.Part == 0 {
		p.staged, p.stagedImport, p.stagedParts = nil, req.Import, 0
	}
	if req.Import != p.stagedImport || req.Part != p.stagedParts {
		p.staged = nil
		return nil, fmt.Errorf("import %q part %d out of order (expected import %q part %d)", req.Import, req.Part, p.stagedImport, p.stagedParts)
	}
	if p.staged == nil {
		p.staged = &embedded.Table{Version: req.Table.Version, State: acl.NewState(nil, nil, nil), Credentials: map[string]*embedded.Credential{}}
	}
	mergeTable(p.staged, req.Table)
	p.stagedParts++
	if req.More {
		return nil, nil
	}
	t := p.staged
	p.staged, p.stagedImport, p.stagedParts = nil, "", 0
	return t, nil
}

// mergeTable adds part's objects to t.
func mergeTable(t, part *embedded.Table) {
	for k, v := range part.State.Roles {
		t.State.Roles[k] = v
	}
	for k, v := range part.State.Groups {
		t.State.Groups[k] = v
	}
	for k, v := range part.State.Clients {
		t.State.Clients[k] = v
	}
	for k, v := range part.Credentials {
		t.Credentials[k] = v
	}
	if part.State.DefaultACL != nil {
		d := *part.State.DefaultACL
		t.State.DefaultACL = &d
	}
}

// importTable replaces the table, persists it whole and starts a new epoch; every non-admin
// connection is ended (its grants may have changed).
func (p *Plugin) importTable(t embedded.Table) error {
	if err := p.store.ImportTable(t); err != nil {
		return err
	}
	epoch := randomID()
	if p.disk != nil {
		p.disk.replaceAll(epoch)
	}
	p.mu.Lock()
	p.epoch = epoch
	p.mu.Unlock()
	p.gen.Add(1)
	p.genChanged()
	wasLoaded := p.loaded.Swap(true)
	c, r, g := p.store.Size()
	p.cfg.Logf("a2a-fleet table: imported %d clients, %d roles, %d groups (epoch %s)", c, r, g, epoch)
	if wasLoaded {
		var users []string
		p.conns.Each(func(u string) {
			if !p.store.IsAdmin(u) {
				users = append(users, u)
			}
		})
		p.conns.Kick(users)
	}
	return nil
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
