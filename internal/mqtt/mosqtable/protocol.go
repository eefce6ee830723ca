// Package mosqtable puts the operator's decision table into the shipped Mosquitto: the
// project's own Mosquitto plugin (hack/mosquitto-plugin/table, a Go c-shared library) holds
// an embedded.Store in the broker's memory and answers CONNECT (MOSQ_EVT_BASIC_AUTH) and every
// PUBLISH, delivery, SUBSCRIBE and UNSUBSCRIBE check (MOSQ_EVT_ACL_CHECK) from its acl.Policy:
// the same code, hence the same decisions, as the embedded broker. The operator sends it the
// same model commands it sends dynsec, on the plugin's own control topic; each is applied in
// microseconds and persisted incrementally (bbolt, the objects a command touched), so a
// change costs the broker the same at 100 and at 100 000 configured clients.
//
// Both ends live here: Plugin is the broker's side (no cgo: the c-shared shim only forwards
// Mosquitto's events), Backend the operator's (an acl.Backend that mirrors the plugin's table,
// so Observe and Check cost no round trip, and gives a broker that lost its disk the whole
// table back in one message). docs/broker.md ("The decision-table plugin") describes it.
package mosqtable

import (
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
)

// Topics of the plugin's control API (Mosquitto's $CONTROL mechanism, as dynsec's).
const (
	ControlTopic  = "$CONTROL/a2a-fleet/v1"
	ResponseTopic = "$CONTROL/a2a-fleet/v1/response"
	// PresenceTopic carries the plugin's connection events (presence.PluginEvent JSON): every
	// CONNECT it accepted or refused and every end of a connection, in the broker's order.
	// Mosquitto hands clients' PUBLISHes to $CONTROL/ topics to the control callbacks and
	// never delivers them, so only the broker writes it; the table lets only the admin
	// subscribe to it.
	PresenceTopic = "$CONTROL/a2a-fleet/v1/presence"
)

// The requests the plugin answers.
const (
	// OpExecute runs model commands (Request.Commands) in order.
	OpExecute = "execute"
	// OpStatus reports Status.
	OpStatus = "status"
	// OpExport returns the whole table (with password hashes, never plaintext).
	OpExport = "export"
	// OpImport replaces the whole table with Request.Table: how a broker that started with an
	// empty disk gets its table back in one transfer. A table larger than the broker's
	// max_packet_size comes in parts (Request.Part from 0, Request.More on all but the last)
	// that the plugin stages and installs at once with the last.
	OpImport = "import"
	// OpPresence returns the live connections (Response.Presence): what the operator learns
	// at every (re)connection, before the events that follow it on PresenceTopic.
	OpPresence = "presence"
)

// Request is one message to ControlTopic.
type Request struct {
	// ID is echoed in the Response (several operators may share the response topic).
	ID       string        `json:"id"`
	Op       string        `json:"op"`
	Commands []acl.Command `json:"commands,omitempty"`
	// Edits carry some modifyRole lists of Commands as edits of the roles the plugin holds
	// (RoleEdit); Base is the generation of the table they were made against.
	Edits []RoleEdit      `json:"edits,omitempty"`
	Base  uint64          `json:"base,omitempty"`
	Table *embedded.Table `json:"table,omitempty"`
	// Import names one import transfer; Part numbers its messages from 0; More says that
	// parts follow (the one without it installs the table).
	Import string `json:"import,omitempty"`
	Part   int    `json:"part,omitempty"`
	More   bool   `json:"more,omitempty"`
}

// Response is the plugin's answer on ResponseTopic.
type Response struct {
	ID string `json:"id"`
	// Error is set when the request as a whole was refused (a command the table refuses is an
	// Outcome instead).
	Error    string             `json:"error,omitempty"`
	Outcomes []embedded.Outcome `json:"outcomes,omitempty"`
	Status   Status             `json:"status"`
	Table    *embedded.Table    `json:"table,omitempty"`
	// Presence is set in the answer to OpPresence.
	Presence *LiveSet `json:"presence,omitempty"`
}

// LiveSet is the connections the plugin let in that have not ended, at At.
type LiveSet struct {
	At      time.Time    `json:"at"`
	Clients []LiveClient `json:"clients"`
}

// LiveClient is one connected client ID.
type LiveClient struct {
	ClientID string    `json:"clientId"`
	Username string    `json:"username"`
	Since    time.Time `json:"since"`
}

// Status is the plugin's state, in every Response.
type Status struct {
	// Loaded is false while the plugin has no table (it started on an empty disk and was
	// never given one): only the bootstrap admin may connect, every other CONNECT is refused.
	Loaded bool `json:"loaded"`
	// Epoch names the table's lineage: set when a table is imported, kept across restarts
	// with the disk.
	Epoch string `json:"epoch,omitempty"`
	// Boot is new at every start of the plugin: a mirror made before it may miss what the
	// broker lost of its last changes, so the operator reads the table again.
	Boot string `json:"boot"`
	// Generation counts the execute and import requests applied to the table of Epoch; it is
	// stored with every disk round and resumes from there after a restart. An admin that sees
	// it move by more than its own requests knows another admin changed the table; one that
	// finds it below the last it saw, after a restart, knows the broker lost changes it had
	// acknowledged (a crash before the disk round).
	Generation uint64 `json:"generation"`
	// RoleEdits says the plugin takes Request.Edits. A plugin from before them does not send
	// it, and would read an edited modifyRole as an empty list: the operator sends it none.
	RoleEdits bool `json:"roleEdits,omitempty"`
	Clients   int  `json:"clients"`
	Roles     int  `json:"roles"`
	Groups    int  `json:"groups"`
}

// ErrTableNotLoaded is the plugin's refusal of commands before it has a table.
const ErrTableNotLoaded = "table not loaded"
