package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate and its key (PEM) into dir.
func writePair(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "operator"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestBrokerTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := writePair(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err := brokerTLS(brokerOptions{}); err != nil || cfg != nil {
		t.Errorf("no TLS flags: want no TLS config, got %v %v", cfg, err)
	}
	const url = "mqtts://broker.example:8883"
	cfg, err := brokerTLS(brokerOptions{url: url, caFile: cert, clientCertFile: cert, clientKeyFile: key})
	if err != nil || cfg.VerifyConnection == nil || cfg.GetClientCertificate == nil || cfg.ServerName != "broker.example" {
		t.Fatalf("CA and client pair: %v %+v", err, cfg)
	}
	for name, o := range map[string]brokerOptions{
		"cert without key":     {url: url, clientCertFile: cert},
		"key without cert":     {url: url, clientKeyFile: key},
		"CA not PEM":           {url: url, caFile: notPEM},
		"CA missing":           {url: url, caFile: filepath.Join(dir, "missing.pem")},
		"key not matching":     {url: url, clientCertFile: cert, clientKeyFile: notPEM},
		"TLS files, plain URL": {url: "tcp://broker:1883", caFile: cert},
	} {
		if _, err := brokerTLS(o); err == nil {
			t.Errorf("%s: want an error", name)
		} else if !strings.Contains(err.Error(), "broker") && !strings.Contains(err.Error(), "--broker") {
			t.Errorf("%s: error does not say what it is about: %v", name, err)
		}
	}
}
