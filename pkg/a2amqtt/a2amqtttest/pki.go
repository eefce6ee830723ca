// Package a2amqtttest holds test helpers for code built on pkg/a2amqtt: a throw-away PKI
// (crypto/x509) and a Mosquitto with a TLS listener that requires client certificates.
package a2amqtttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// PKI is a test certificate authority that writes its certificates as PEM files.
type PKI struct {
	dir  string
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	next int64
}

// NewPKI creates a CA named name; CAFile is its certificate.
func NewPKI(t testing.TB, name string) *PKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &PKI{dir: t.TempDir(), ca: ca, key: key, next: 2}
	writePEM(t, p.Path("ca.pem"), "CERTIFICATE", der)
	return p
}

// Path is a file in the PKI's directory.
func (p *PKI) Path(name string) string { return filepath.Join(p.dir, name) }

// CAFile is the CA certificate (PEM).
func (p *PKI) CAFile() string { return p.Path("ca.pem") }

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Issue signs a leaf certificate (server: for 127.0.0.1; otherwise a client certificate) and
// writes name.pem and name-key.pem.
func (p *PKI) Issue(t testing.TB, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	return p.issue(t, name, server, nil)
}

// IssueServerFor signs a server certificate for the DNS names (the first is its name), as
// cert-manager issues one for a Service, and writes name.pem and name-key.pem.
func (p *PKI) IssueServerFor(t testing.TB, dnsNames ...string) (certFile, keyFile string) {
	t.Helper()
	return p.issue(t, dnsNames[0], true, dnsNames)
}

func (p *PKI) issue(t testing.TB, name string, server bool, dnsNames []string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.next), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	p.next++
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = dnsNames
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = p.Path(name+".pem"), p.Path(name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

// StartTLSMosquitto starts Mosquitto with, besides its plain listener, a TLS listener that
// requires a client certificate signed by pki's CA; it returns the broker and the mqtts:// URL.
func StartTLSMosquitto(t testing.TB, pki *PKI) (plain *brokertest.Mosquitto, tlsURL string) {
	t.Helper()
	cert, key := pki.Issue(t, "broker", true)
	port := brokertest.FreePort(t)
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{ExtraConfig: fmt.Sprintf(
		"listener %d 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\nrequire_certificate true\n",
		port, pki.CAFile(), cert, key)})
	return m, fmt.Sprintf("mqtts://127.0.0.1:%d", port)
}
