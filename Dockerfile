# tailguard image: the same CLI as the README (`tailguard ...`).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY pipeline ./pipeline
COPY producers ./producers
COPY sql ./sql
COPY data ./data
RUN pip install --no-cache-dir -c constraints.txt .
ENTRYPOINT ["tailguard"]
