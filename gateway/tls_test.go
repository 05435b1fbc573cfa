package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a certificate authority made by a test, and the files of the
// certificates it issued.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string // the CA's certificate, PEM
	pool   *x509.CertPool
	serial int64
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key, serial: 1, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = filepath.Join(p.dir, "ca.pem")
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// issue writes a certificate for name (a server's 127.0.0.1, or a
// client's) and its key as name.pem and name-key.pem, and returns their
// paths and the certificate.
func (p *pki) issue(t *testing.T, name string, client bool, notAfter time.Time) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile, cert
}

// clientCert loads a client certificate issue wrote.
func clientCert(t *testing.T, certFile, keyFile string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLoadTLS: the files must exist and parse at start-up; a client CA
// file must hold a certificate.
func TestLoadTLS(t *testing.T) {
	p := newPKI(t)
	cert, key, _ := p.issue(t, "server", false, time.Now().Add(time.Hour))
	env := base()
	env["SLUICE_TLS_CERT_FILE"], env["SLUICE_TLS_KEY_FILE"], env["SLUICE_TLS_CLIENT_CA_FILE"] = cert, key, p.caFile
	c, err := load(env)
	if err != nil || c.certs == nil {
		t.Fatalf("load: %v", err)
	}
	garbage := filepath.Join(p.dir, "garbage.pem")
	os.WriteFile(garbage, []byte("not a certificate"), 0o600)
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_TLS_CERT_FILE": garbage}, "SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: tls: failed to find any PEM data in certificate input"},
		{map[string]string{"SLUICE_TLS_KEY_FILE": cert}, "SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: tls: found a certificate rather than a key in the PEM for the private key"},
		{map[string]string{"SLUICE_TLS_CLIENT_CA_FILE": garbage}, "SLUICE_TLS_CLIENT_CA_FILE: no PEM certificate in " + garbage},
		{map[string]string{"SLUICE_TLS_CLIENT_CA_FILE": "/nonexistent/ca.pem"}, "SLUICE_TLS_CLIENT_CA_FILE: open /nonexistent/ca.pem: no such file or directory"},
	} {
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range tc.set {
			e[k] = v
		}
		_, err := load(e)
		if err == nil || !strings.HasSuffix(err.Error(), "\n  "+tc.want) {
			t.Errorf("%v: %v, want %q", tc.set, err, tc.want)
		}
	}
}

// TestTLSSuites: at TLS 1.2 the public, check and gRPC listeners agree
// only on ECDHE key exchange with an AEAD cipher (AES-GCM,
// ChaCha20-Poly1305): a client that offers nothing but CBC suites (with
// SHA-1 or SHA-256) or RSA key exchange fails its handshake, and one
// that offers ECDHE-GCM or TLS 1.3 completes it.
func TestTLSSuites(t *testing.T) {
	p := newPKI(t)
	certFile, keyFile, _ := p.issue(t, "server", false, time.Now().Add(time.Hour))
	env := base()
	env["SLUICE_UPSTREAM"] = "http://127.0.0.1:1" // never reached: only handshakes
	env["SLUICE_RULES"] = "login: POST /api/login by ip 100/1m"
	env["SLUICE_TLS_CERT_FILE"], env["SLUICE_TLS_KEY_FILE"] = certFile, keyFile
	env["SLUICE_CHECK_LISTEN"], env["SLUICE_RLS_LISTEN"] = "127.0.0.1:0", "127.0.0.1:0"
	r := start(t, env)
	check, rlsAddr := r.addr(t, "SLUICE_CHECK_LISTEN"), r.addr(t, "SLUICE_RLS_LISTEN")
	listeners := map[string]string{"public": strings.TrimPrefix(r.url, "http://"), "check": check, "grpc": rlsAddr}
	refused := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256,
		tls.TLS_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_RSA_WITH_AES_128_CBC_SHA,
	}
	accepted := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	}
	handshake := func(addr string, cfg *tls.Config) (*tls.ConnectionState, error) {
		cfg.RootCAs = p.pool
		d := &net.Dialer{Timeout: 5 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		st := conn.ConnectionState()
		return &st, nil
	}
	for name, addr := range listeners {
		for _, suite := range refused {
			if _, err := handshake(addr, &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}}); err == nil {
				t.Errorf("%s: a TLS 1.2 handshake offering only %s succeeded", name, tls.CipherSuiteName(suite))
			}
		}
		for _, suite := range accepted {
			st, err := handshake(addr, &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}})
			if err != nil || st.CipherSuite != suite {
				t.Errorf("%s: a TLS 1.2 handshake offering %s: %v", name, tls.CipherSuiteName(suite), err)
			}
		}
		if st, err := handshake(addr, &tls.Config{MinVersion: tls.VersionTLS13}); err != nil || st.Version != tls.VersionTLS13 {
			t.Errorf("%s: a TLS 1.3 handshake: %v", name, err)
		}
	}
}

// TestTLSSuitesListed: every TLS 1.2 suite a listener offers, whatever
// its certificate's key, is ECDHE with an AEAD cipher.
func TestTLSSuitesListed(t *testing.T) {
	c := &certificates{}
	c.state.Store(&certState{})
	outer := c.serverConfig("h2")
	inner, err := outer.GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []*tls.Config{outer, inner} {
		if len(cfg.CipherSuites) == 0 {
			t.Fatal("no suites listed: Go's defaults, CBC with SHA-1 among them, would apply")
		}
		for _, s := range cfg.CipherSuites {
			name := tls.CipherSuiteName(s)
			if !strings.HasPrefix(name, "TLS_ECDHE_") || !(strings.Contains(name, "_GCM_") || strings.Contains(name, "_CHACHA20_POLY1305")) {
				t.Errorf("%s offered", name)
			}
		}
	}
}
