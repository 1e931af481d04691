package redistest

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
	"strconv"
	"testing"
	"time"
)

// Certs is a throw-away PKI made for one test: a CA, a server certificate
// it signed (IP SAN 127.0.0.1, DNS SAN localhost) and a client certificate
// it signed, all ECDSA P-256, written as PEM files in a t.TempDir().
type Certs struct {
	Dir string

	CAFile string // the CA certificate (PEM)
	CA     *x509.Certificate
	Pool   *x509.CertPool // holds CA only

	CertFile string // server certificate (PEM)
	KeyFile  string // server private key (PKCS#8 PEM)

	ClientCertFile string // client certificate (PEM), for tls-auth-clients
	ClientKeyFile  string // client private key (PKCS#8 PEM)
}

// NewCerts generates a fresh CA and the server and client certificates it
// signs. Two calls give two unrelated CAs: one's CAFile is the "wrong CA"
// for the other's server. It calls t.Fatalf on any error.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	c := &Certs{
		Dir:            dir,
		CAFile:         filepath.Join(dir, "ca.crt"),
		CertFile:       filepath.Join(dir, "server.crt"),
		KeyFile:        filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.crt"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
	}
	fail := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("redistest: certificates: %s: %v", what, err)
		}
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	fail("CA key", err)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "redistest CA " + strconv.FormatInt(now.UnixNano(), 36)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	fail("CA certificate", err)
	c.CA, err = x509.ParseCertificate(caDER)
	fail("parse CA", err)
	c.Pool = x509.NewCertPool()
	c.Pool.AddCert(c.CA)
	fail("write CA", writePEM(c.CAFile, "CERTIFICATE", caDER))

	leaf := func(certFile, keyFile, cn string, usage x509.ExtKeyUsage, server bool) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		fail(cn+" key", err)
		tmpl := &x509.Certificate{
			SerialNumber: serial(t),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, c.CA, &key.PublicKey, caKey)
		fail(cn+" certificate", err)
		fail("write "+cn, writePEM(certFile, "CERTIFICATE", der))
		pk, err := x509.MarshalPKCS8PrivateKey(key)
		fail(cn+" key encoding", err)
		fail("write "+cn+" key", writePEM(keyFile, "PRIVATE KEY", pk))
	}
	leaf(c.CertFile, c.KeyFile, "redistest server", x509.ExtKeyUsageServerAuth, true)
	leaf(c.ClientCertFile, c.ClientKeyFile, "redistest client", x509.ExtKeyUsageClientAuth, false)
	return c
}

// ClientTLS returns a client tls.Config that trusts only c's CA and
// presents c's client certificate.
func (c *Certs) ClientTLS(t testing.TB) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(c.ClientCertFile, c.ClientKeyFile)
	if err != nil {
		t.Fatalf("redistest: client certificate: %v", err)
	}
	return &tls.Config{RootCAs: c.Pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// StartTLS starts redis-server serving TLS only (--port 0 --tls-port P) with
// certs' server certificate, on a free 127.0.0.1 port, and waits until it
// answers PING over TLS. Clients are not asked for a certificate
// (--tls-auth-clients no) unless extraArgs say otherwise, e.g.
// "--tls-auth-clients", "yes". Addr, Client, CLI, Kill and Restart work as
// for Start (Client and CLI speak TLS, trusting certs' CA). Debian's and
// most builds of redis-server support TLS; one that does not fails the test.
func StartTLS(t testing.TB, certs *Certs, extraArgs ...string) *Server {
	t.Helper()
	clientTLS := certs.ClientTLS(t)
	return startTB(t, LaunchOptions{
		TLS:     clientTLS,
		CLIArgs: []string{"--tls", "--cacert", certs.CAFile, "--cert", certs.ClientCertFile, "--key", certs.ClientKeyFile},
		ArgsFor: func(port int, dir string) ([]string, error) {
			return append([]string{
				"--save", "", "--appendonly", "no",
				"--bind", "127.0.0.1", "--port", "0", "--dir", dir,
				"--tls-port", strconv.Itoa(port),
				"--tls-cert-file", certs.CertFile,
				"--tls-key-file", certs.KeyFile,
				"--tls-ca-cert-file", certs.CAFile,
				"--tls-auth-clients", "no",
			}, extraArgs...), nil
		},
	})
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("redistest: serial: %v", err)
	}
	return n
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
