#!/usr/bin/env bash
echo "demo: not available yet (engine under construction)"
