//go:build mosquittoplugin

// Command table is the a2a-fleet decision-table plugin for Mosquitto 2.0, built as a C shared
// library (hack/build-mosquitto-table-plugin.sh: go build -buildmode=c-shared, cgo against
// Debian's mosquitto-dev). plugin.c registers Mosquitto's events and forwards them here;
// every decision is internal/mqtt/mosqtable's Plugin, i.e. the embedded broker's store and
// acl.Policy. The build tag keeps it out of `go build ./...` on machines without the headers.
//
// Options (plugin_opt_... in mosquitto.conf, after the plugin line):
//
//	admin_username       the bootstrap admin (required)
//	admin_password       its password, or
//	admin_password_file  a file holding it (a mounted Secret)
//	state_dir            where the table is kept (bbolt); empty: memory only
//
// Environment (diagnostics, off by default): A2A_FLEET_TABLE_TRACE=1 logs every control message
// and disk round (mosqtable.PluginConfig.Trace); profile.go's variables take profiles.
package main

/*
#cgo CFLAGS: -std=gnu99 -O2 -Wall
#cgo LDFLAGS: -Wl,--unresolved-symbols=ignore-all
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

void a2a_table_kick(const char *username);
void a2a_table_log(int level, const char *msg);
void a2a_table_publish(const char *topic, const void *payload, int len);
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/cgo"
	"strings"
	"unsafe"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/mosqtable"
)

func main() {}

func logf(level C.int) func(string, ...any) {
	return func(format string, args ...any) {
		msg := C.CString(fmt.Sprintf(format, args...))
		C.a2a_table_log(level, msg)
		C.free(unsafe.Pointer(msg))
	}
}

// view is a C string seen as a Go string without copying: the decisions never keep it.
func view(s *C.char) string {
	if s == nil {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(s)), int(C.strlen(s)))
}

func plugin(h C.uintptr_t) *mosqtable.Plugin {
	return cgo.Handle(h).Value().(*mosqtable.Plugin)
}

//export a2aTableInit
func a2aTableInit(keys, values **C.char, n C.int) C.uintptr_t {
	cfg := mosqtable.PluginConfig{
		Logf: logf(C.MOSQ_LOG_NOTICE),
		// The disk writer's goroutine must not call Mosquitto's logging (see PluginConfig).
		BackgroundLogf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		},
		Kick: func(username string) {
			u := C.CString(username)
			C.a2a_table_kick(u)
			C.free(unsafe.Pointer(u))
		},
		Publish: func(topic string, payload []byte) {
			t := C.CString(topic)
			data := C.CBytes(payload)
			C.a2a_table_publish(t, data, C.int(len(payload)))
			C.free(data)
			C.free(unsafe.Pointer(t))
		},
	}
	if os.Getenv("A2A_FLEET_TABLE_TRACE") != "" {
		cfg.Trace = os.Stderr
	}
	ks := unsafe.Slice(keys, int(n))
	vs := unsafe.Slice(values, int(n))
	fail := logf(C.MOSQ_LOG_ERR)
	for i := range ks {
		k, v := C.GoString(ks[i]), C.GoString(vs[i])
		switch k {
		case "admin_username":
			cfg.AdminUsername = v
		case "admin_password":
			cfg.AdminPassword = v
		case "admin_password_file":
			data, err := os.ReadFile(v)
			if err != nil {
				fail("a2a-fleet table: admin_password_file: %v", err)
				return 0
			}
			cfg.AdminPassword = strings.TrimSpace(string(data))
		case "state_dir":
			cfg.StateDir = v
		}
	}
	p, err := mosqtable.StartPlugin(cfg)
	if err != nil {
		fail("a2a-fleet table: %v", err)
		return 0
	}
	return C.uintptr_t(cgo.NewHandle(p))
}

//export a2aTableCleanup
func a2aTableCleanup(h C.uintptr_t) {
	if h == 0 {
		return
	}
	if err := plugin(h).Close(); err != nil {
		logf(C.MOSQ_LOG_ERR)("a2a-fleet table: close: %v", err)
	}
	cgo.Handle(h).Delete()
}

//export a2aTableBasicAuth
func a2aTableBasicAuth(h, conn C.uintptr_t, username, password, clientID *C.char) C.int {
	if plugin(h).Authenticate(mosqtable.ConnID(conn), view(username), view(password), view(clientID)) {
		return C.MOSQ_ERR_SUCCESS
	}
	return C.MOSQ_ERR_AUTH
}

//export a2aTableACLCheck
func a2aTableACLCheck(h C.uintptr_t, username *C.char, access C.int, topic *C.char) C.int {
	var a acl.Access
	switch access {
	case C.MOSQ_ACL_READ:
		a = acl.Receive
	case C.MOSQ_ACL_WRITE:
		a = acl.Publish
	case C.MOSQ_ACL_SUBSCRIBE:
		a = acl.Subscribe
	case C.MOSQ_ACL_UNSUBSCRIBE:
		a = acl.Unsubscribe
	default:
		return C.MOSQ_ERR_ACL_DENIED
	}
	if plugin(h).Allows(view(username), a, view(topic)) {
		return C.MOSQ_ERR_SUCCESS
	}
	return C.MOSQ_ERR_ACL_DENIED
}

//export a2aTableControl
func a2aTableControl(h C.uintptr_t, sender *C.char, payload unsafe.Pointer, length C.int, outLen *C.int) unsafe.Pointer {
	resp := plugin(h).Control(view(sender), C.GoBytes(payload, length))
	*outLen = C.int(len(resp))
	return C.CBytes(resp)
}

//export a2aTableDisconnect
func a2aTableDisconnect(h, conn C.uintptr_t, reason C.int) {
	plugin(h).Disconnected(mosqtable.ConnID(conn), disconnectReason(reason))
}

// disconnectReason says in words why Mosquitto ended a connection (the MOSQ_ERR_* code of
// its disconnect event; the same words as its log lines where it has one).
func disconnectReason(rc C.int) string {
	switch rc {
	case -1:
		// Mosquitto 2.0's disconnect event always says -1 (context__disconnect): the plugin
		// cannot tell a DISCONNECT from a lost socket or a keep-alive timeout.
		return mosqtable.ConnectionEndedReason
	case C.MOSQ_ERR_SUCCESS:
		return "disconnected (the client sent DISCONNECT)"
	case C.MOSQ_ERR_CONN_LOST:
		return "connection closed without DISCONNECT"
	case C.MOSQ_ERR_KEEPALIVE:
		return "keep-alive timeout: the client went silent"
	case C.MOSQ_ERR_ADMINISTRATIVE_ACTION:
		return mosqtable.KickedReason
	case C.MOSQ_ERR_AUTH, C.MOSQ_ERR_ACL_DENIED:
		return "not authorised"
	case C.MOSQ_ERR_PROTOCOL, C.MOSQ_ERR_MALFORMED_PACKET, C.MOSQ_ERR_MALFORMED_UTF8, C.MOSQ_ERR_DUPLICATE_PROPERTY:
		return "disconnected due to protocol error"
	case C.MOSQ_ERR_OVERSIZE_PACKET:
		return "disconnected due to an oversize packet"
	case C.MOSQ_ERR_NOMEM:
		return "disconnected: the broker is out of memory"
	}
	// No mosquitto_strerror: the broker does not export libmosquitto's symbols to plugins.
	return fmt.Sprintf("disconnected (broker error code %d)", int(rc))
}
