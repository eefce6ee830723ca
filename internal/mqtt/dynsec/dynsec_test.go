package dynsec

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

func start(t *testing.T) (*brokertest.Mosquitto, *Backend) {
	t.Helper()
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	user, pass := m.DynSecAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Connect(ctx, Config{URL: m.URL(), Username: user, Password: pass, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, m.Log())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return m, b
}

func TestEncodeShapes(t *testing.T) {
	cases := []struct {
		cmd  acl.Command
		want string
	}{
		{acl.Command{Op: acl.OpCreateClient, Username: "a2a:u", Password: "p", Groups: []string{"a2a:g"}},
			`{"command":"createClient","username":"a2a:u","password":"p","groups":[{"groupname":"a2a:g"}]}`},
		{acl.Command{Op: acl.OpModifyClient, Username: "a2a:u"},
			`{"command":"modifyClient","username":"a2a:u","clientid":"","roles":[],"groups":[]}`},
		{acl.Command{Op: acl.OpSetDefaultACLAccess, Default: acl.DenyByDefault},
			`{"command":"setDefaultACLAccess","acls":[{"acltype":"publishClientSend","allow":false},{"acltype":"publishClientReceive","allow":true},{"acltype":"subscribe","allow":false},{"acltype":"unsubscribe","allow":true}]}`},
		{acl.Command{Op: acl.OpAddRoleACL, Role: "a2a:r", ACL: acl.ACL{Type: acl.SubscribeLiteral, Topic: "t", Priority: 0}},
			`{"command":"addRoleACL","rolename":"a2a:r","acltype":"subscribeLiteral","topic":"t","priority":0,"allow":false}`},
	}
	for _, c := range cases {
		w, err := encode(c.cmd)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(w)
		if string(got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.cmd, got, c.want)
		}
	}
}

func TestConnectRefusedAdmin(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := Connect(ctx, Config{URL: m.URL(), Username: "admin", Password: "wrong"})
	if err == nil || !strings.Contains(err.Error(), "refused admin") {
		t.Fatalf("want a refused-admin error, got %v", err)
	}
	if time.Since(t0) > 5*time.Second {
		t.Errorf("refusal took %v; should fail at the first CONNACK", time.Since(t0))
	}
}

func TestObserveEmptyAndForeignObjectsHidden(t *testing.T) {
	_, b := start(t)
	ctx := context.Background()
	st, err := b.Observe(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Roles)+len(st.Groups)+len(st.Clients) != 0 {
		t.Fatalf("the admin user/role must not be observed: %+v", st)
	}
	if st.DefaultACL == nil || *st.DefaultACL != acl.DenyByDefault {
		t.Fatalf("default ACL access = %+v, want dynsec's defaults %+v", st.DefaultACL, acl.DenyByDefault)
	}
	// Check works for foreign users too: the admin may publish to $CONTROL.
	d, err := b.Check(ctx, "admin", acl.Publish, ControlTopic)
	if err != nil || !d.Allow {
		t.Fatalf("admin publish to %s: %v %v", ControlTopic, d, err)
	}
}

func TestListPaging(t *testing.T) {
	_, b := start(t)
	b.cfg.ListPageSize = 3
	ctx := context.Background()
	var roles []acl.Role
	for i := 0; i < 8; i++ {
		roles = append(roles, acl.Role{Name: "a2a:r" + string(rune('a'+i))})
	}
	if _, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState(roles, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Observe(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Roles) != 8 {
		t.Fatalf("paged listing saw %d roles, want 8", len(st.Roles))
	}
}

func TestExecuteReportsBrokerErrors(t *testing.T) {
	_, b := start(t)
	err := b.Execute(context.Background(), []acl.Command{
		{Op: acl.OpModifyRole, Role: "a2a:missing"},
		{Op: acl.OpCreateRole, Role: "a2a:ok"},
		{Op: acl.OpCreateRole, Role: "a2a:ok"}, // already exists: benign
	})
	var ce *acl.CommandError
	if !errors.As(err, &ce) || ce.Command.Op != acl.OpModifyRole || ce.Message != "Role does not exist" {
		t.Fatalf("want the broker's modifyRole error, got %v", err)
	}
	if !strings.Contains(err.Error(), `modify role: role "a2a:missing"`) {
		t.Errorf("error should name the command and object: %v", err)
	}
	st, err := b.Observe(context.Background(), &acl.Names{Roles: []string{"a2a:ok", "a2a:missing"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Roles["a2a:ok"]; !ok || len(st.Roles) != 1 {
		t.Fatalf("commands after a failing one still run: %+v", st.Roles)
	}
}

// While the broker is down, requests wait for the reconnect (bounded by
// their timeout) and then go through.
func TestReconnectWhileWaiting(t *testing.T) {
	m, b := start(t)
	m.Kill()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState([]acl.Role{{Name: "a2a:after-crash"}}, nil, nil)})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("ensure across a broker crash: %v", err)
	}
	st, err := b.Observe(context.Background(), &acl.Names{Roles: []string{"a2a:after-crash"}})
	if err != nil || len(st.Roles) != 1 {
		t.Fatalf("role after reconnect: %+v %v", st.Roles, err)
	}
}

func TestTimeoutWhileBrokerDown(t *testing.T) {
	m, b := start(t)
	m.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := b.Observe(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "waiting for the admin connection") {
		t.Fatalf("want a clear timeout, got %v", err)
	}
}

// The admin connection works over TLS (a second, TLS-only listener).
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	pool, certFile, keyFile := selfSigned(t, dir)
	port := brokertest.FreePort(t)
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{
		DynSec:      &brokertest.DynSecOptions{},
		ExtraConfig: fmt.Sprintf("listener %d 127.0.0.1\ncertfile %s\nkeyfile %s\n", port, certFile, keyFile),
	})
	user, pass := m.DynSecAdmin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Connect(ctx, Config{URL: fmt.Sprintf("tls://127.0.0.1:%d", port), Username: user, Password: pass,
		TLS: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}})
	if err != nil {
		t.Fatalf("connect over TLS: %v\n%s", err, m.Log())
	}
	defer b.Close(ctx)
	if _, err := acl.Apply(ctx, b, acl.Desired{State: acl.NewState([]acl.Role{{Name: "a2a:tls"}}, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	// Without trusting the CA the handshake fails and Connect says why.
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	_, err = Connect(short, Config{URL: fmt.Sprintf("tls://127.0.0.1:%d", port), Username: user, Password: pass,
		TLS: &tls.Config{ServerName: "127.0.0.1"}, ConnectTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("want a certificate error, got %v", err)
	}
}

func selfSigned(t *testing.T, dir string) (*x509.CertPool, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool, certFile, keyFile
}

// Concurrent callers share control messages (group commit): while one message is in flight the
// next collects every queued request, each caller gets exactly its own replies, and a refusal
// reaches only the caller whose command it was.
func TestConcurrentCallersShareMessages(t *testing.T) {
	_, b := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 50
	before := b.Stats().RoundTrips
	errs := make(chan error, n)
	for i := range n {
		go func() {
			cmd := acl.Command{Op: acl.OpCreateRole, Role: fmt.Sprintf("a2a:gc-%02d", i)}
			if i == 7 {
				cmd = acl.Command{Op: acl.OpModifyRole, Role: "a2a:gc-missing"}
			}
			errs <- b.Execute(ctx, []acl.Command{cmd})
		}()
	}
	failed := 0
	for range n {
		if err := <-errs; err != nil {
			failed++
			if !strings.Contains(err.Error(), "a2a:gc-missing") {
				t.Errorf("a caller got another caller's error: %v", err)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d callers failed, want exactly the one with the bad command", failed)
	}
	trips := b.Stats().RoundTrips - before
	t.Logf("%d concurrent single-command calls took %d messages", n, trips)
	if trips >= n/2 {
		t.Errorf("%d messages for %d concurrent calls: requests are not sharing messages", trips, n)
	}
	st, err := b.Observe(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Roles) != n-1 {
		t.Errorf("%d roles created, want %d", len(st.Roles), n-1)
	}
}

// A slow broker gets smaller messages: one stays within about a third of the request timeout at
// the measured cost per command, so a large Mosquitto configuration does not time out.
func TestBatchLimitFollowsCommandCost(t *testing.T) {
	b, err := New(Config{URL: "mqtt://127.0.0.1:1", Username: "admin", Timeout: 9 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.batchLimit(); got != 100 {
		t.Fatalf("no measurement yet: limit %d, want MaxBatch 100", got)
	}
	b.observeCost(100*100*time.Millisecond, 100) // 100 ms per command
	if got := b.batchLimit(); got != 30 {
		t.Fatalf("100 ms per command with a 9 s timeout: limit %d, want 30", got)
	}
	for range 20 {
		b.observeCost(10*time.Millisecond, 100) // fast again
	}
	if got := b.batchLimit(); got != 100 {
		t.Fatalf("fast broker again: limit %d, want 100", got)
	}
}
