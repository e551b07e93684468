#!/bin/sh
# The --no-python worker: touches <dir>/<RANK> and says so.
echo "creating $RANK"
touch "$1/$RANK"
