//go:build mosquittoplugin

// Command httpauth is the a2a-fleet HTTP-auth plugin for Mosquitto 2.0, built as a C shared
// library (hack/build-mosquitto-httpauth-plugin.sh: go build -buildmode=c-shared, cgo against
// Debian's mosquitto-dev). It is the caller side of mosquitto-go-auth's HTTP backend (the same
// requests, the same acc values, the same answer cache), so the decision service
// (cmd/decision-service, internal/mqtt/decision) is proven called by a real Mosquitto in the
// tests; mosquitto-go-auth itself is not served by this machine's Go module proxy, so it cannot
// be built here (docs/scale.md, "Running on an EMQX cluster").
//
// Options (plugin_opt_... in mosquitto.conf, go-auth's names without auth_opt_):
//
//	http_host, http_port  the decision service (required)
//	http_getuser_uri      default /mosquitto-go-auth/user
//	http_superuser_uri    default /mosquitto-go-auth/superuser ("-": none)
//	http_aclcheck_uri     default /mosquitto-go-auth/acl
//	http_timeout          seconds (default 5)
//	auth_cache_seconds    keep CONNECT answers (default 0: ask every time)
//	acl_cache_seconds     keep ACL answers (default 0)
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

void a2a_httpauth_log(int level, const char *msg);
*/
import "C"

import (
	"fmt"
	"net"
	"runtime/cgo"
	"strconv"
	"time"
	"unsafe"

	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/decision"
)

func main() {}

type plugin struct {
	caller *decision.Caller
}

func logf(level C.int, format string, args ...any) {
	msg := C.CString(fmt.Sprintf(format, args...))
	C.a2a_httpauth_log(level, msg)
	C.free(unsafe.Pointer(msg))
}

func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

func seconds(k, v string) (time.Duration, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q: want whole seconds", k, v)
	}
	return time.Duration(n) * time.Second, nil
}

func configure(opts map[string]string) (decision.CallerConfig, error) {
	host, port := opts["http_host"], opts["http_port"]
	if host == "" || port == "" {
		return decision.CallerConfig{}, fmt.Errorf("http_host and http_port are required")
	}
	cfg := decision.CallerConfig{BaseURL: "http://" + net.JoinHostPort(host, port),
		UserURI: opts["http_getuser_uri"], SuperuserURI: opts["http_superuser_uri"], ACLURI: opts["http_aclcheck_uri"]}
	for k, dst := range map[string]*time.Duration{"http_timeout": &cfg.Timeout, "auth_cache_seconds": &cfg.AuthCacheTTL, "acl_cache_seconds": &cfg.ACLCacheTTL} {
		if v, ok := opts[k]; ok {
			d, err := seconds(k, v)
			if err != nil {
				return decision.CallerConfig{}, err
			}
			*dst = d
		}
	}
	return cfg, nil
}

//export a2aHTTPAuthInit
func a2aHTTPAuthInit(keys, values **C.char, n C.int) C.uintptr_t {
	opts := map[string]string{}
	ks, vs := unsafe.Slice(keys, int(n)), unsafe.Slice(values, int(n))
	for i := range ks {
		opts[C.GoString(ks[i])] = C.GoString(vs[i])
	}
	cfg, err := configure(opts)
	if err == nil {
		var c *decision.Caller
		if c, err = decision.NewCaller(cfg); err == nil {
			logf(C.MOSQ_LOG_NOTICE, "a2a-fleet httpauth: asking %s (auth cache %s, acl cache %s)", cfg.BaseURL, cfg.AuthCacheTTL, cfg.ACLCacheTTL)
			return C.uintptr_t(cgo.NewHandle(&plugin{caller: c}))
		}
	}
	logf(C.MOSQ_LOG_ERR, "a2a-fleet httpauth: %v", err)
	return 0
}

//export a2aHTTPAuthCleanup
func a2aHTTPAuthCleanup(h C.uintptr_t) {
	if h != 0 {
		cgo.Handle(h).Delete()
	}
}

func get(h C.uintptr_t) *plugin { return cgo.Handle(h).Value().(*plugin) }

//export a2aHTTPAuthBasicAuth
func a2aHTTPAuthBasicAuth(h C.uintptr_t, username, password, clientID *C.char) C.int {
	if username == nil || password == nil {
		return C.MOSQ_ERR_AUTH
	}
	ok, err := get(h).caller.Authenticate(goString(username), goString(password), goString(clientID))
	if err != nil {
		logf(C.MOSQ_LOG_WARNING, "a2a-fleet httpauth: authentication of %q refused: %v", goString(username), err)
	}
	if ok {
		return C.MOSQ_ERR_SUCCESS
	}
	return C.MOSQ_ERR_AUTH
}

//export a2aHTTPAuthACLCheck
func a2aHTTPAuthACLCheck(h C.uintptr_t, username, clientID *C.char, access C.int, topic *C.char) C.int {
	if username == nil || topic == nil {
		return C.MOSQ_ERR_ACL_DENIED
	}
	// Mosquitto's MOSQ_ACL_* values are go-auth's acc values.
	ok, err := get(h).caller.Allows(goString(username), goString(clientID), goString(topic), int(access))
	if err != nil {
		logf(C.MOSQ_LOG_WARNING, "a2a-fleet httpauth: check of %q refused: %v", goString(username), err)
	}
	if ok {
		return C.MOSQ_ERR_SUCCESS
	}
	return C.MOSQ_ERR_ACL_DENIED
}
