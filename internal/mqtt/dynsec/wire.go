package dynsec

import (
	"encoding/json"
	"fmt"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// Topics of the dynamic-security plugin's control API.
const (
	ControlTopic  = "$CONTROL/dynamic-security/v1"
	ResponseTopic = "$CONTROL/dynamic-security/v1/response"
)

// wireCmd is one entry of {"commands":[...]}: the plugin's own field names.
// Absent fields matter (e.g. modifyClient without "roles" keeps the roles),
// so optional ones are pointers or omitempty.
type wireCmd struct {
	Command         string        `json:"command"`
	CorrelationData string        `json:"correlationData,omitempty"`
	Rolename        string        `json:"rolename,omitempty"`
	Groupname       string        `json:"groupname,omitempty"`
	Username        string        `json:"username,omitempty"`
	Password        string        `json:"password,omitempty"`
	ClientID        *string       `json:"clientid,omitempty"`
	ACLType         string        `json:"acltype,omitempty"`
	Topic           string        `json:"topic,omitempty"`
	Priority        *int          `json:"priority,omitempty"`
	Allow           *bool         `json:"allow,omitempty"`
	ACLs            *[]wireACL    `json:"acls,omitempty"`
	Roles           *[]wireRef    `json:"roles,omitempty"`
	Groups          *[]wireGroup  `json:"groups,omitempty"`
	Verbose         *bool         `json:"verbose,omitempty"`
	Count           *int          `json:"count,omitempty"`
	Offset          *int          `json:"offset,omitempty"`
	DefaultACLs     []wireDefault `json:"-"`
}

// MarshalJSON puts setDefaultACLAccess's list under "acls" (the same key as
// a role's ACLs, with a different shape).
func (w wireCmd) MarshalJSON() ([]byte, error) {
	type plain wireCmd
	if w.DefaultACLs == nil {
		return json.Marshal(plain(w))
	}
	return json.Marshal(struct {
		plain
		ACLs []wireDefault `json:"acls"`
	}{plain(w), w.DefaultACLs})
}

type wireACL struct {
	ACLType  string `json:"acltype"`
	Topic    string `json:"topic"`
	Priority int    `json:"priority"`
	Allow    bool   `json:"allow"`
}

type wireRef struct {
	Rolename string `json:"rolename"`
	Priority *int   `json:"priority,omitempty"`
}

type wireGroup struct {
	Groupname string `json:"groupname"`
	Priority  *int   `json:"priority,omitempty"`
}

type wireDefault struct {
	ACLType string `json:"acltype"`
	Allow   bool   `json:"allow"`
}

type request struct {
	Commands []wireCmd `json:"commands"`
}

type responseEnvelope struct {
	Responses []response `json:"responses"`
}

type response struct {
	Command         string          `json:"command"`
	Error           string          `json:"error,omitempty"`
	CorrelationData string          `json:"correlationData,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
}

func ptr[T any](v T) *T { return &v }

func toWireACLs(acls []acl.ACL) *[]wireACL {
	out := make([]wireACL, 0, len(acls))
	for _, a := range acls {
		out = append(out, wireACL{ACLType: string(a.Type), Topic: a.Topic, Priority: a.Priority, Allow: a.Allow})
	}
	return &out
}

func toWireRefs(refs []acl.RoleRef) *[]wireRef {
	out := make([]wireRef, 0, len(refs))
	for _, r := range refs {
		out = append(out, wireRef{Rolename: r.Name, Priority: ptr(r.Priority)})
	}
	return &out
}

// toWireGroups leaves the membership priority out: dynsec then uses its
// default (-1), which is acl.GroupMembershipPriority.
func toWireGroups(groups []string) *[]wireGroup {
	out := make([]wireGroup, 0, len(groups))
	for _, g := range groups {
		out = append(out, wireGroup{Groupname: g})
	}
	return &out
}

// commandNames are the plugin's names of the model's changes (all exist in Mosquitto 2.0.11).
var commandNames = map[acl.Op]string{
	acl.OpSetDefaultACLAccess: "setDefaultACLAccess",
	acl.OpCreateRole:          "createRole",
	acl.OpModifyRole:          "modifyRole",
	acl.OpDeleteRole:          "deleteRole",
	acl.OpAddRoleACL:          "addRoleACL",
	acl.OpRemoveRoleACL:       "removeRoleACL",
	acl.OpCreateGroup:         "createGroup",
	acl.OpDeleteGroup:         "deleteGroup",
	acl.OpAddGroupRole:        "addGroupRole",
	acl.OpRemoveGroupRole:     "removeGroupRole",
	acl.OpCreateClient:        "createClient",
	acl.OpModifyClient:        "modifyClient",
	acl.OpDeleteClient:        "deleteClient",
	acl.OpSetClientPassword:   "setClientPassword",
	acl.OpSetClientID:         "setClientId",
	acl.OpAddClientRole:       "addClientRole",
	acl.OpRemoveClientRole:    "removeClientRole",
	acl.OpAddGroupClient:      "addGroupClient",
	acl.OpRemoveGroupClient:   "removeGroupClient",
}

// encode translates a model command into the plugin's JSON. The choices of
// which fields to send are deliberate (see acl.Diff and docs/broker.md):
// createClient never carries roles, lists are always sent in full.
func encode(c acl.Command) (wireCmd, error) {
	w := wireCmd{Command: commandNames[c.Op]}
	switch c.Op {
	case acl.OpSetDefaultACLAccess:
		w.DefaultACLs = []wireDefault{
			{ACLType: "publishClientSend", Allow: c.Default.PublishClientSend},
			{ACLType: "publishClientReceive", Allow: c.Default.PublishClientReceive},
			{ACLType: "subscribe", Allow: c.Default.Subscribe},
			{ACLType: "unsubscribe", Allow: c.Default.Unsubscribe},
		}
	case acl.OpCreateRole, acl.OpModifyRole:
		w.Rolename, w.ACLs = c.Role, toWireACLs(c.ACLs)
	case acl.OpDeleteRole:
		w.Rolename = c.Role
	case acl.OpAddRoleACL:
		w.Rolename, w.ACLType, w.Topic = c.Role, string(c.ACL.Type), c.ACL.Topic
		w.Priority, w.Allow = ptr(c.ACL.Priority), ptr(c.ACL.Allow)
	case acl.OpRemoveRoleACL:
		w.Rolename, w.ACLType, w.Topic = c.Role, string(c.ACL.Type), c.ACL.Topic
	case acl.OpCreateGroup, acl.OpDeleteGroup:
		w.Groupname = c.Group
	case acl.OpAddGroupRole:
		w.Groupname, w.Rolename, w.Priority = c.Group, c.Role, ptr(c.Priority)
	case acl.OpRemoveGroupRole:
		w.Groupname, w.Rolename = c.Group, c.Role
	case acl.OpCreateClient:
		w.Username, w.Password = c.Username, c.Password
		if c.ClientID != "" {
			w.ClientID = ptr(c.ClientID)
		}
		if len(c.Groups) > 0 {
			w.Groups = toWireGroups(c.Groups)
		}
	case acl.OpModifyClient:
		w.Username, w.ClientID = c.Username, ptr(c.ClientID)
		w.Roles, w.Groups = toWireRefs(c.Roles), toWireGroups(c.Groups)
	case acl.OpDeleteClient:
		w.Username = c.Username
	case acl.OpSetClientPassword:
		if c.Password == "" {
			return w, fmt.Errorf("%s: %w", c, acl.ErrNoPassword)
		}
		w.Username, w.Password = c.Username, c.Password
	case acl.OpSetClientID:
		w.Username, w.ClientID = c.Username, ptr(c.ClientID)
	case acl.OpAddClientRole:
		w.Username, w.Rolename, w.Priority = c.Username, c.Role, ptr(c.Priority)
	case acl.OpRemoveClientRole:
		w.Username, w.Rolename = c.Username, c.Role
	case acl.OpAddGroupClient:
		w.Groupname, w.Username = c.Group, c.Username
	case acl.OpRemoveGroupClient:
		w.Groupname, w.Username = c.Group, c.Username
	default:
		return w, fmt.Errorf("dynsec: unsupported command %q", c.Op)
	}
	return w, nil
}

// Shapes of the "data" of read replies.

type roleData struct {
	Rolename string    `json:"rolename"`
	ACLs     []wireACL `json:"acls"`
}

type refData struct {
	Rolename string `json:"rolename"`
	Priority *int   `json:"priority"`
}

type groupData struct {
	Groupname string    `json:"groupname"`
	Roles     []refData `json:"roles"`
	Clients   []struct {
		Username string `json:"username"`
	} `json:"clients"`
}

type clientData struct {
	Username string      `json:"username"`
	ClientID string      `json:"clientid"`
	Disabled bool        `json:"disabled"`
	Roles    []refData   `json:"roles"`
	Groups   []wireGroup `json:"groups"`
}

type listData struct {
	TotalCount int          `json:"totalCount"`
	Roles      []roleData   `json:"roles"`
	Groups     []groupData  `json:"groups"`
	Clients    []clientData `json:"clients"`
}

type getData struct {
	Role   *roleData   `json:"role"`
	Group  *groupData  `json:"group"`
	Client *clientData `json:"client"`
}

type defaultData struct {
	ACLs []wireDefault `json:"acls"`
}

// Absent priorities mean dynsec's default of -1 (it omits -1 when listing).
func refsFromWire(in []refData) []acl.RoleRef {
	out := make([]acl.RoleRef, 0, len(in))
	for _, r := range in {
		p := -1
		if r.Priority != nil {
			p = *r.Priority
		}
		out = append(out, acl.RoleRef{Name: r.Rolename, Priority: p})
	}
	return out
}

func (r roleData) model() acl.Role {
	out := acl.Role{Name: r.Rolename, ACLs: make([]acl.ACL, 0, len(r.ACLs))}
	for _, a := range r.ACLs {
		out.ACLs = append(out.ACLs, acl.ACL{Type: acl.ACLType(a.ACLType), Topic: a.Topic, Priority: a.Priority, Allow: a.Allow})
	}
	return out
}

func (g groupData) model() acl.Group {
	return acl.Group{Name: g.Groupname, Roles: refsFromWire(g.Roles)}
}

func (c clientData) model() acl.Client {
	out := acl.Client{Username: c.Username, ClientID: c.ClientID, Roles: refsFromWire(c.Roles)}
	for _, g := range c.Groups {
		out.Groups = append(out.Groups, g.Groupname)
	}
	return out
}

func (d defaultData) model() acl.DefaultACLAccess {
	var out acl.DefaultACLAccess
	for _, a := range d.ACLs {
		switch a.ACLType {
		case "publishClientSend":
			out.PublishClientSend = a.Allow
		case "publishClientReceive":
			out.PublishClientReceive = a.Allow
		case "subscribe":
			out.Subscribe = a.Allow
		case "unsubscribe":
			out.Unsubscribe = a.Allow
		}
	}
	return out
}
