package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// TLS on the public, check and gRPC listeners (SLUICE_TLS_CERT_FILE,
// SLUICE_TLS_KEY_FILE, SLUICE_TLS_CLIENT_CA_FILE). The files are read at
// start-up, where a file that cannot be read or parsed stops sluice, and
// again on SIGHUP, where it keeps the running certificates. Each
// handshake takes the certificates in force then (GetConfigForClient), so
// new connections get a renewed certificate at once and open ones are
// never dropped. The admin listener stays plain HTTP: probes and
// Prometheus reach it on loopback or inside the cluster.

// certificates are the TLS files and what was last read from them. Safe
// for concurrent use.
type certificates struct {
	certFile, keyFile, caFile string
	state                     atomic.Pointer[certState]
}

// certState is one reading of the files.
type certState struct {
	cert      tls.Certificate
	clientCAs *x509.CertPool // nil: no client certificate asked for
}

// loadTLS validates the SLUICE_TLS_* settings and reads their files,
// adding every problem to problems; it returns nil without TLS, or when
// there was a problem.
func loadTLS(problems *[]string, s settings) *certificates {
	n := len(*problems)
	switch {
	case s.TLSCertFile != "" && s.TLSKeyFile == "":
		*problems = append(*problems, "SLUICE_TLS_KEY_FILE: required with SLUICE_TLS_CERT_FILE")
	case s.TLSCertFile == "" && s.TLSKeyFile != "":
		*problems = append(*problems, "SLUICE_TLS_CERT_FILE: required with SLUICE_TLS_KEY_FILE")
	case s.TLSCertFile == "" && s.TLSClientCAFile != "":
		*problems = append(*problems, "SLUICE_TLS_CLIENT_CA_FILE: needs SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: callers are asked for a certificate in a TLS handshake")
	}
	if len(*problems) > n || s.TLSCertFile == "" {
		return nil
	}
	c := &certificates{certFile: s.TLSCertFile, keyFile: s.TLSKeyFile, caFile: s.TLSClientCAFile}
	st, errs := c.read()
	for _, err := range errs {
		*problems = append(*problems, err.Error())
	}
	if len(errs) > 0 {
		return nil
	}
	c.state.Store(st)
	return c
}

// read reads and parses the files, returning every problem.
func (c *certificates) read() (*certState, []error) {
	var errs []error
	st := &certState{}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		errs = append(errs, fmt.Errorf("SLUICE_TLS_CERT_FILE and SLUICE_TLS_KEY_FILE: %w", err))
	} else {
		st.cert = cert
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("SLUICE_TLS_CLIENT_CA_FILE: %w", err))
		default:
			st.clientCAs = x509.NewCertPool()
			if !st.clientCAs.AppendCertsFromPEM(pem) {
				errs = append(errs, fmt.Errorf("SLUICE_TLS_CLIENT_CA_FILE: no PEM certificate in %s", c.caFile))
			}
		}
	}
	return st, errs
}

// reload reads the files again and puts them in force for the handshakes
// that begin from now on. When one cannot be read or parsed, the running
// certificates stay and the error says why.
func (c *certificates) reload() error {
	st, errs := c.read()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	c.state.Store(st)
	return nil
}

// notAfter is when the certificate in force expires.
func (c *certificates) notAfter() time.Time {
	if leaf := c.state.Load().cert.Leaf; leaf != nil {
		return leaf.NotAfter
	}
	return time.Time{}
}

// cipherSuites are the TLS 1.2 suites every listener offers: ECDHE key
// exchange (forward secrecy) with an AEAD cipher, for ECDSA and RSA
// certificates alike. Go's defaults add CBC suites with SHA-1 (and
// would take RSA key exchange back with a GODEBUG); none is offered.
// TLS 1.3's suites are Go's, which are all AEAD and not configurable.
var cipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// serverConfig is the TLS configuration of a listener that offers
// nextProtos (ALPN: "h2" and "http/1.1" for HTTP, "h2" for gRPC): TLS 1.2
// with cipherSuites, or TLS 1.3; each handshake gets the certificates in
// force, and, with a client CA, must present a client certificate that
// one of its CAs signed.
func (c *certificates) serverConfig(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: cipherSuites,
		NextProtos:   nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st := c.state.Load()
			cfg := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				CipherSuites: cipherSuites,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{st.cert},
			}
			if st.clientCAs != nil {
				cfg.ClientCAs = st.clientCAs
				cfg.ClientAuth = tls.RequireAndVerifyClientCert
			}
			// The session ticket keys stay the outer configuration's, so
			// resumption survives a reload.
			return cfg, nil
		},
	}
}
