#!/bin/sh
# pouchdb-server with the admin from COUCHDB_USER / COUCHDB_PASSWORD (as Apache CouchDB's image takes
# them): written into config.json, which pouchdb-server reads (and hashes) at start.
set -eu
: "${COUCHDB_USER:?set COUCHDB_USER}" "${COUCHDB_PASSWORD:?set COUCHDB_PASSWORD}"
cd /opt/couchdb/data
if [ ! -s config.json ]; then
  umask 077
  printf '{"admins": {"%s": "%s"}, "log": {"file": "/opt/couchdb/data/log.txt"}}\n' \
    "$COUCHDB_USER" "$COUCHDB_PASSWORD" > config.json
fi
exec node /opt/pouchdb/node_modules/pouchdb-server/bin/pouchdb-server \
  --host 0.0.0.0 --port 5984 --dir /opt/couchdb/data --config /opt/couchdb/data/config.json "$@"
