// Command nullextender is a kube-scheduler extender that does nothing, the baseline of
// hack/bench-scale.py: what the extender protocol itself costs. nodeCacheCapable: filter
// passes every node name it is sent, prioritize scores every node zero; no bind, no preempt.
// It prints the port it listens on (127.0.0.1 only), then serves until killed.
//
// With -tls-cert, -tls-key and -client-ca it serves as tidelease's extender does in
// clusterScheduler mode: HTTPS, and only to clients with a certificate of that CA.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
)

// args is the part of ExtenderArgs a nodeCacheCapable extender reads.
type args struct {
	NodeNames *[]string `json:"NodeNames"`
}

type filterResult struct {
	NodeNames   *[]string         `json:"NodeNames"`
	FailedNodes map[string]string `json:"FailedNodes"`
	Error       string            `json:"Error"`
}

type hostPriority struct {
	Host  string `json:"Host"`
	Score int64  `json:"Score"`
}

func decode(w http.ResponseWriter, r *http.Request) (args, bool) {
	var a args
	if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return a, false
	}
	return a, true
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		log.Printf("reply: %v", err)
	}
}

func tlsListener(ln net.Listener, certFile, keyFile, clientCA string) (net.Listener, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", clientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tls.NewListener(ln, cfg), nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	certFile := flag.String("tls-cert", "", "serve HTTPS with this certificate")
	keyFile := flag.String("tls-key", "", "the certificate's key")
	clientCA := flag.String("client-ca", "", "require client certificates of this CA")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *certFile != "" {
		ln, err = tlsListener(ln, *certFile, *keyFile, *clientCA)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	http.HandleFunc("/filter", func(w http.ResponseWriter, r *http.Request) {
		if a, ok := decode(w, r); ok {
			reply(w, filterResult{NodeNames: a.NodeNames, FailedNodes: map[string]string{}})
		}
	})
	http.HandleFunc("/prioritize", func(w http.ResponseWriter, r *http.Request) {
		if a, ok := decode(w, r); ok {
			scores := []hostPriority{}
			if a.NodeNames != nil {
				for _, n := range *a.NodeNames {
					scores = append(scores, hostPriority{Host: n})
				}
			}
			reply(w, scores)
		}
	})
	log.Fatal(http.Serve(ln, nil))
}
