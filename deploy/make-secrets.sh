#!/bin/sh
# Creates the secret files deploy/compose.yaml mounts: a Postgres password, the coordinator's
# database URL (with that password), its admin token and the workers' status token. These are
# kept when they exist, so re-running is safe. With FEDPROMPT_ENROLLMENT_TOKEN set (a token from
# `fedprompt token create`), it also writes the workers' enrolment token, replacing an older one.
# The folder is private to you (0700); the files are 0644 so that the containers' own user
# (uid 10001) can read them once Docker mounts them.
# Usage: [FEDPROMPT_ENROLLMENT_TOKEN=fpe_...] sh deploy/make-secrets.sh [FOLDER]   (default: deploy/secrets)
set -eu
dir=${1:-$(dirname "$0")/secrets}
mkdir -p "$dir"
chmod 700 "$dir"
[ -e "$dir/.gitignore" ] || printf '*\n' >"$dir/.gitignore"

random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

write() { # name value
  [ -e "$dir/$1" ] && return 0
  replace "$1" "$2"
}

replace() { # name value
  (umask 077 && printf '%s\n' "$2" >"$dir/$1.tmp")
  chmod 644 "$dir/$1.tmp"
  mv "$dir/$1.tmp" "$dir/$1"
  echo "wrote $dir/$1"
}

write postgres_password "$(random)"
write fedprompt_database_url "postgresql+psycopg://fedprompt:$(tr -d '\n' <"$dir/postgres_password")@postgres:5432/fedprompt"
write fedprompt_admin_token "$(random)"
write fedprompt_worker_token "$(random)"
if [ -n "${FEDPROMPT_ENROLLMENT_TOKEN:-}" ]; then
  replace fedprompt_enrollment_token "$FEDPROMPT_ENROLLMENT_TOKEN"
fi
